"""``cache clean``: remove output folders (``<outputs>/<recipe>/<variant>/``) whose recipe is gone,
or that the user names. Dry run by default: nothing is deleted without ``--yes``.

A variant (a link ``<variant>`` or ``<variant>.failed`` into ``.builds/``, or a plain folder of
older versions) can go when the recipe file its ``report.json`` names no longer exists and
``recipes/`` has no recipe of that name either, or when its link points at nothing. A folder
without a readable ``report.json`` is listed as unknown and removed only when named. Removal goes
through :func:`~hyperexport.product.builds.cleanup.remove_publication` (the link first, then what it
names), which removes only links into ``.builds/``: a chosen folder (or link) hyperexport did not
write is kept, reported as kept, and not counted; ``--yes`` then exits 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hyperexport.base import exit_codes
from hyperexport.base.sizes import human_size
from hyperexport.engine.inventory import disk_usage
from hyperexport.product.builds.cleanup import is_publication_link, remove_publication
from hyperexport.product.builds.report import REPORT
from hyperexport.product.cli.table import render_table
from hyperexport.product.cli.usage import UsageError, check_dir
from hyperexport.product.config import DEFAULT_OUTPUTS_DIR, RECIPES_DIR


@dataclass(frozen=True)
class Variant:
    """One output folder.

    Attributes:
        recipe: The recipe folder's name.
        variant: The variant folder's name (``default``, ``opset=17``, ...).
        path: The folder.
        recipe_file: The recipe file its report names (None without a readable report).
    """

    recipe: str
    variant: str
    path: Path
    recipe_file: str | None

    @property
    def label(self) -> str:
        return f"{self.recipe}/{self.variant}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``cache clean``."""
    parser.add_argument(
        "targets", nargs="*", metavar="RECIPE[/VARIANT]", help="also remove these outputs"
    )
    parser.add_argument("--outputs-dir", type=Path, help="the outputs root (default: as the build)")
    parser.add_argument("--yes", action="store_true", help="remove (default: only list)")


def variants(root: Path) -> list[Variant]:
    """Every ``<recipe>/<variant>`` under the outputs ``root``: links (dangling ones too) and
    plain folders; dot names (``.builds``, ``.hydra``, temporary links) are skipped."""
    found = []
    for recipe_dir in sorted(_children(root)):
        if recipe_dir.is_dir() and not recipe_dir.is_symlink():
            for path in sorted(_children(recipe_dir)):
                if path.is_dir() or path.is_symlink():
                    found.append(Variant(recipe_dir.name, path.name, path, _recipe_file(path)))
    return found


def _children(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if not p.name.startswith(".")]


def _recipe_file(path: Path) -> str | None:
    try:
        report = json.loads((path / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    recipe = report.get("recipe") if isinstance(report, Mapping) else None
    file = recipe.get("file") if isinstance(recipe, Mapping) else None
    return file if isinstance(file, str) else None


def why_stale(variant: Variant, recipes_dir: Path = RECIPES_DIR) -> str | None:
    """Why ``variant`` can go (its recipe is gone), or None if its recipe exists or is unknown."""
    if variant.path.is_symlink() and not variant.path.exists():
        return "its link points at nothing"
    if variant.recipe_file is None:
        return None
    if Path(variant.recipe_file).is_file() or (recipes_dir / f"{variant.recipe}.yaml").is_file():
        return None
    return f"recipe file {variant.recipe_file} is gone"


def select(
    found: list[Variant], targets: list[str], recipes_dir: Path = RECIPES_DIR
) -> list[tuple[Variant, str]]:
    """The variants to remove, with why: every stale one, plus those ``targets`` name.

    Raises:
        ValueError: A target names no output folder.
    """
    chosen: dict[Path, tuple[Variant, str]] = {}
    for v in found:
        reason = why_stale(v, recipes_dir)
        if reason:
            chosen[v.path] = (v, reason)
    for target in targets:
        recipe, _, variant = target.strip("/").partition("/")
        matches = [v for v in found if v.recipe == recipe and variant in ("", v.variant)]
        if not matches:
            raise ValueError(f"no output folder {target!r}")
        for v in matches:
            chosen.setdefault(v.path, (v, "named"))
    return sorted(chosen.values(), key=lambda item: item[0].label)


def remove(variant: Variant) -> bool:
    """Delete one variant (its link and publication), and its recipe folder when left empty.

    Returns:
        Whether it was removed: only a link hyperexport made is (see :func:`remove_publication`).
    """
    removed = remove_publication(variant.path)
    parent = variant.path.parent
    if not any(parent.iterdir()):
        parent.rmdir()
    return removed


#: Why a chosen folder stays: ``clean`` removes only the links it made and what they name.
NOT_OURS = "not a link into .builds/ that hyperexport made: left untouched"


def run_clean(args: argparse.Namespace) -> int:
    """``cache clean``: list (or, with ``--yes``, remove) the chosen output folders."""
    root = (args.outputs_dir or DEFAULT_OUTPUTS_DIR).expanduser().resolve()
    check_dir(root, "outputs", writable=args.yes)
    found = variants(root) if root.is_dir() else []
    try:
        chosen = select(found, args.targets)
    except ValueError as e:
        raise UsageError(str(e)) from e
    verb = "removed" if args.yes else "would remove"
    rows = []
    freed = 0
    gone = 0
    kept: list[str] = []
    for variant, reason in chosen:
        size = disk_usage(variant.path)
        ours = is_publication_link(variant.path)
        if ours and args.yes:
            ours = remove(variant)
        if not ours:
            kept.append(variant.label)
            rows.append(["kept" if args.yes else "would keep", variant.label, "-", NOT_OURS])
            continue
        gone += 1
        freed += size
        rows.append([verb, variant.label, human_size(size), reason])
    for line in render_table(["ACTION", "OUTPUT", "SIZE", "WHY"], rows)[1:]:
        print(line)
    unknown = [v.label for v in found if v.recipe_file is None and v.path.exists()]
    if unknown:
        print(f"left {len(unknown)} folders without a readable {REPORT}: {', '.join(unknown)}")
    hint = "" if args.yes or not gone else " (dry run: add --yes to remove)"
    print(
        f"{verb} {gone} of {len(found)} output folders, {human_size(freed)}; outputs {root}{hint}"
    )
    if kept:
        print(f"kept {len(kept)} chosen folders hyperexport did not write: {', '.join(kept)}")
    return exit_codes.FAILED if kept and args.yes else exit_codes.OK

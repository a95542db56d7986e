"""``python -m hyperexport lock``: write ``hyperexport.lock`` (see :mod:`hyperexport.product.cli.lock_file`).

Usage::

    hyperexport lock                      # every locked variant's inputs; artifacts kept if unchanged
    hyperexport lock --build              # also build each variant (cache hits when warm) and
                                          # record its published artifacts' digests
    hyperexport lock --recipe llama       # refresh only these recipes' entries
    hyperexport cache status --lock       # which variants the tree would rebuild, and why

Exit codes (:mod:`hyperexport.base.exit_codes`): 0 written (or fresh); 1 a build failed, or
(``cache status --lock``) the committed lock is stale; 2 invalid arguments or recipe.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import NoReturn

from hyperexport.base import exit_codes
from hyperexport.base.errors import RecipeError
from hyperexport.product.cli.lock_file import (
    LOCK_CONFIG,
    LOCK_FILE,
    LockEntry,
    Variant,
    compare,
    locked_variants,
    read_lock,
    stale_entries,
    variant_inputs,
    write_lock,
)
from hyperexport.product.cli.table import render_table
from hyperexport.product.cli.usage import UsageError

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The ``lock`` argument parser."""
    parser = _Parser(
        prog="hyperexport lock",
        description="Write hyperexport.lock: one entry per variant CI builds (conf/lock.yaml, "
        "else every recipe's default variant) with what it depends on and yields.",
    )
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="NAME",
        help="refresh only the entries of this recipe (repeatable; default: all)",
    )
    parser.add_argument(
        "--build",
        action="store_true",
        help="build each variant (cache hits when warm) and record its artifacts' digests",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="the cache of --build (default: as the build)"
    )
    parser.add_argument(
        "--outputs-dir", type=Path, help="the outputs root of --build (default: as the build)"
    )
    parser.add_argument(
        "--lock-file", type=Path, default=LOCK_FILE, help=f"the lock file (default {LOCK_FILE})"
    )
    parser.add_argument(
        "--config", type=Path, default=LOCK_CONFIG, help=f"the variant list (default {LOCK_CONFIG})"
    )
    return parser


def main(argv: list[str]) -> int:
    """Run ``lock``; returns the exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(message)s")
    try:
        args = build_parser().parse_args(argv)
        return _lock(args)
    except UsageError as e:
        print(e, file=sys.stderr)
        return exit_codes.INVALID
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except RecipeError as e:
        print(f"hyperexport lock: {e}", file=sys.stderr)
        return exit_codes.INVALID


def _lock(args: argparse.Namespace) -> int:
    variants = locked_variants(args.config)
    unknown = sorted(set(args.recipe) - {v.recipe for v in variants})
    if unknown:
        raise UsageError(f"--recipe {', '.join(unknown)}: not a locked variant's recipe")
    try:
        old = read_lock(args.lock_file)
    except RecipeError as e:  # another format (or not a lock): rewritten whole
        log.warning("%s: %s; rewriting it whole", args.lock_file, e.reason)
        old = {}
    selected = [v for v in variants if not args.recipe or v.recipe in args.recipe]
    entries = {name: e for name, e in old.items() if name in {v.name for v in variants}}
    code = exit_codes.OK
    for i, variant in enumerate(selected, 1):
        inputs = variant_inputs(variant)
        previous = old.get(variant.name)
        unchanged = previous is not None and not compare(previous, inputs)
        artifacts = previous.artifacts if previous is not None and unchanged else {}
        if args.build:
            built = _build(variant, _settings(args))
            if built is None:
                code = exit_codes.FAILED
            else:
                artifacts = built
        entries[variant.name] = LockEntry(
            variant.recipe, list(variant.overrides), inputs, artifacts
        )
        state = "unchanged" if unchanged else "updated"
        print(f"[{i}/{len(selected)}] {variant.name}: {state}", flush=True)
    write_lock(entries, args.lock_file)
    print(f"wrote {args.lock_file} ({len(entries)} variants)")
    return code


def _settings(args: argparse.Namespace) -> list[str]:
    """The build-setting overrides of ``--build`` (where, never what)."""
    out = []
    if args.cache_dir is not None:
        out.append(f"build.cache_dir={args.cache_dir.resolve()}")
    if args.outputs_dir is not None:
        out.append(f"build.outputs_dir={args.outputs_dir.resolve()}")
    return out


def _build(variant: Variant, settings_overrides: list[str]) -> dict[str, str] | None:
    """Build ``variant``; ``{published file: sha256}``, or None if the build failed."""
    from hyperexport.product.builds.session import run_build, variant_dir
    from hyperexport.product.config.hydra import compose_recipe
    from hyperexport.product.stages import PIPELINE, model_loader

    recipe, settings = compose_recipe(
        [f"recipe={variant.recipe}", *variant.overrides, *settings_overrides],
        stage_names=[s.name for s in PIPELINE],
    )
    outcome = run_build(
        recipe,
        settings,
        stages=PIPELINE,
        load_model=model_loader(recipe),
        variant=variant_dir(variant.overrides),
        overrides=variant.overrides,
    )
    if outcome.exit_code != 0 or outcome.report is None:
        log.error("lock: %s failed to build (exit %d)", variant.name, outcome.exit_code)
        return None
    files = outcome.report.get("files") or {}
    return {
        name: str(info.get("digest") if isinstance(info, dict) else info)
        for name, info in sorted(files.items())
    }


def status_lock(lock_file: Path = LOCK_FILE, config: Path = LOCK_CONFIG) -> int:
    """``cache status --lock``: which locked variants the current tree would rebuild, and why.

    Builds nothing. Returns 1 when the lock is stale (CI fails), else 0.
    """
    try:
        variants = locked_variants(config)
        stale = stale_entries(variants, read_lock(lock_file))
    except RecipeError as e:
        print(f"hyperexport cache status --lock: {e}", file=sys.stderr)
        return exit_codes.INVALID
    rows = [[name, "would rebuild", reason] for name, reason in stale]
    for line in render_table(["VARIANT", "STATUS", "REASON"], rows):
        print(line)
    stale_names = {name for name, _ in stale}
    fresh = sum(v.name not in stale_names for v in variants)
    print(
        f"{fresh} of {len(variants)} variants as locked in {lock_file}"
        + ("" if not stale else "; run `hyperexport lock` and commit the file")
    )
    return exit_codes.FAILED if stale else exit_codes.OK

"""Which recipe source a recipe folder of the outputs belongs to (``outputs/README.md``).

``outputs/<name>/`` holds the publications of one recipe source: the recipe shipped in
hyperexport's ``recipes/`` under that name, or one recipe file kept elsewhere
(``recipe_file=``). Every ``report.json`` records its source (``recipe.source``); a build whose
recipe has the same ``name`` but another source stops before any stage runs, naming both recipe
files (exit code 3), instead of replacing the other recipe's publication.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.config.paths import RECIPES_DIR
from hyperexport.errors import CacheUnavailableError

#: How ``report.json`` names a recipe shipped in hyperexport's ``recipes/`` folder: by its place
#: there, so a publication made from another checkout of hyperexport has the same source.
SHIPPED_PREFIX = "recipes/"


class ForeignRecipeError(CacheUnavailableError):
    """``outputs/<name>/`` holds publications of another recipe source (exit code 3)."""

    def __init__(self, recipe_dir: Path, published_file: str, recipe_file: str) -> None:
        self.recipe_dir = recipe_dir
        super().__init__(
            f"{recipe_dir} holds the publications of recipe {published_file}; this build's "
            f"recipe {recipe_file} has the same name, and a build never replaces another "
            f"recipe's publications: give it another name, choose another build.outputs_dir, "
            f"or remove them first (hyperexport cache clean {recipe_dir.name} --yes)"
        )


def recipe_source(recipe_file: str) -> str:
    """The source of the recipe in ``recipe_file``: ``recipes/<stem>.yaml`` for a recipe
    shipped in hyperexport's ``recipes/`` folder, else the file's absolute, resolved path."""
    if not recipe_file:
        return recipe_file
    path = Path(recipe_file).expanduser().resolve()
    if path.parent == RECIPES_DIR.resolve():
        return f"{SHIPPED_PREFIX}{path.name}"
    return str(path)


def published_source(report: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(source, recipe file)`` a publication's report records; a report written before
    sources were recorded gives its recipe file's source. None when it names no file."""
    recipe = report.get("recipe")
    if not isinstance(recipe, Mapping):
        return None
    file, source = recipe.get("file"), recipe.get("source")
    if not isinstance(file, str) or not file:
        return None
    return (source if isinstance(source, str) and source else recipe_source(file)), file


def check_same_source(recipe_dir: Path, recipe_file: str) -> None:
    """Refuse to publish into ``recipe_dir`` when a publication there (a ``<variant>`` or
    ``<variant>.failed`` link) was made from another recipe source than ``recipe_file``.

    Raises:
        ForeignRecipeError: naming the recipe file of that publication and ``recipe_file``.
    """
    from hyperexport.builds.report import read_report  # it records recipe_source()

    if not recipe_dir.is_dir():
        return
    mine = recipe_source(recipe_file)
    for link in sorted(recipe_dir.iterdir()):
        if link.name.startswith(".") or not link.is_symlink():
            continue
        report = read_report(link) if os.path.isdir(link) else None
        found = published_source(report) if report is not None else None
        if found is not None and found[0] != mine:
            raise ForeignRecipeError(recipe_dir, found[1], recipe_file)

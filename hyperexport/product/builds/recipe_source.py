"""Which recipe source a recipe folder of the outputs belongs to (``outputs/README.md``).

``outputs/<name>/`` holds the publications of one recipe source: the recipe shipped in
hyperexport's ``recipes/`` under that name, or one recipe file kept elsewhere
(``recipe_file=``). Every ``report.json`` records its source (``recipe.source``); a build whose
recipe has the same ``name`` but another source stops before any stage runs, naming both recipe
files (exit code 3), instead of replacing the other recipe's publication
(``publish.check_same_source`` reads the reports; this module reads nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.errors import CacheUnavailableError
from hyperexport.product.config.paths import RECIPES_DIR

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

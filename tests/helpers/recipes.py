"""The shipped recipes: which the installed transformers refuses (they name a class of a later
release), and each one composed once per test process."""

from __future__ import annotations

import copy
import dataclasses
import functools
import re

from hyperexport.base import versions
from hyperexport.product.config import RECIPES_DIR, BuildSettings, Recipe, compose_recipe

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def needs_later_transformers(name: str) -> str | None:
    """The one-line refusal recipe ``name`` gets here (it names a transformers class of a later
    release, ``versions.TRANSFORMERS_CLASSES_SINCE``), or None when it is usable."""
    text = (RECIPES_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    for path in re.findall(r"transformers\.models\.[\w.]+", text):
        refusal = versions.missing_transformers_class(path)
        if refusal:
            return refusal
    return None


#: The recipes usable with the installed transformers (all of them on 5.x).
USABLE = [name for name in RECIPES if needs_later_transformers(name) is None]
REFUSED = {name: needs_later_transformers(name) for name in RECIPES if name not in USABLE}


@functools.cache
def _composed(name: str) -> tuple[Recipe, BuildSettings]:
    return compose_recipe([f"recipe={name}"])


def composed(name: str) -> tuple[Recipe, BuildSettings]:
    """``compose_recipe(["recipe=<name>"])``, composed once per test process (Hydra takes a
    few tenths of a second a recipe, and several test modules compose all of them); each caller
    gets its own copy of the data."""
    recipe, build = _composed(name)
    return dataclasses.replace(recipe, data=copy.deepcopy(recipe.data)), build

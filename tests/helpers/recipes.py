"""Which recipes the installed transformers refuses, because they name a class of a later one."""

from __future__ import annotations

import re

from hyperexport.base import versions
from hyperexport.product.config import RECIPES_DIR

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

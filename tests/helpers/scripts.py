"""The repository's scripts (``bench/*.py``, ``noxfile.py``) loaded as modules, by path: they are
not in a package, and tests import their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str | None = None) -> ModuleType:
    """The script at ``REPO / relative`` as a module named ``name`` (its stem by default),
    registered in ``sys.modules`` (a dataclass looks its module up there)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module

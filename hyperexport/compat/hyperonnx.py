"""``hyperexport.compat.hyperonnx``: HyperONNX's public names with its defaults.

Its public home: the code is in :mod:`hyperexport.library.compat.hyperonnx`, and this module re-
exports it (every other name of it too, read on first use). Not deprecated: ``docs/library.md``
tells HyperONNX users to switch to it (a changed import).
"""

from __future__ import annotations

from typing import Any

from hyperexport.library.compat import hyperonnx as _home
from hyperexport.library.compat.hyperonnx import *  # noqa: F403  (its __all__, declared there)
from hyperexport.library.compat.hyperonnx import __all__ as __all__


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

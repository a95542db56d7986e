"""``hyperexport.models.pretrained``: the model factory for transformers checkpoints.

Its public home: the code is in :mod:`hyperexport.library.models.pretrained`, and this module
re-exports it (every other name of it too, read on first use). Not deprecated: recipes name it
as ``model._target_`` (the README, ``recipes/README.md``), and the recipe validation reads its
parameters from source through this module's import.
"""

from __future__ import annotations

from typing import Any

from hyperexport.library.models import pretrained as _home
from hyperexport.library.models.pretrained import (
    FLOAT_DTYPES,
    WEIGHT_PATTERNS,
    pretrained,
    pretrained_skeleton,
    read_checkpoint_config,
)

__all__ = [
    "FLOAT_DTYPES",
    "WEIGHT_PATTERNS",
    "pretrained",
    "pretrained_skeleton",
    "read_checkpoint_config",
]


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

"""``hyperexport.transformers.kv_layers``: generation-ready decoder layers
(``explicit_kv_layers``).

Its public home: the code is in :mod:`hyperexport.library.transformers.kv_layers`, and this
module re-exports it (every other name of it too, read on first use). Not deprecated: the
README's Library section and ``docs/library.md`` name it, and published models record ``KVStep``
and ``KVCacheLayer`` by this path.
"""

from __future__ import annotations

from typing import Any

from hyperexport.library.transformers import kv_layers as _home
from hyperexport.library.transformers.kv_layers import (
    KVCacheLayer,
    KVStep,
    Wrapped,
    explicit_kv_layers,
    layer_index_zero,
    swapped_layers,
)

__all__ = [
    "KVCacheLayer",
    "KVStep",
    "Wrapped",
    "explicit_kv_layers",
    "layer_index_zero",
    "swapped_layers",
]


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

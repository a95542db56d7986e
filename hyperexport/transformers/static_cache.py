"""``hyperexport.transformers.static_cache``: the KV cache as a tensor (``StaticCache``).

Its public home: the code is in :mod:`hyperexport.library.transformers.static_cache`, and this
module re-exports it (every other name of it too, read on first use). Not deprecated: the
README's Library section and ``docs/library.md`` name it, and published models record
``ExplicitKVCacheModel`` by this path.
"""

from __future__ import annotations

from typing import Any

from hyperexport.library.transformers import static_cache as _home
from hyperexport.library.transformers.static_cache import (
    ExplicitKVCacheModel,
    StaticCache,
    StaticCacheView,
    size_of,
)

__all__ = [
    "ExplicitKVCacheModel",
    "StaticCache",
    "StaticCacheView",
    "size_of",
]


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

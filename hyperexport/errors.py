"""Deprecated: this module moved to :mod:`hyperexport.base.errors` (issue 33).

Importing it still works, with a DeprecationWarning naming the new path; every name is read from
there. It goes in the release after next.
"""

from __future__ import annotations

import warnings
from typing import Any

from hyperexport.base import errors as _moved

warnings.warn(
    "hyperexport.errors moved to hyperexport.base.errors; import from there",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

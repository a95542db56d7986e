"""Deprecated: this module moved to :mod:`hyperexport.base.exit_codes` (issue 33).

Importing it still works, with a DeprecationWarning naming the new path; every name is read from
there. It goes in the release after next.
"""

from __future__ import annotations

import warnings
from typing import Any

from hyperexport.base import exit_codes as _moved

warnings.warn(
    "hyperexport.exit_codes moved to hyperexport.base.exit_codes; import from there",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

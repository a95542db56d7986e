"""Deprecated: this module moved to :mod:`hyperexport.library.api` (issue 33).

Importing it still works, with a DeprecationWarning naming the new path; every name is read from
there. It goes in the release after next. The public names it defined are on the package
(``from hyperexport import ...``).
"""

from __future__ import annotations

import warnings
from typing import Any

from hyperexport.library import api as _moved

warnings.warn(
    "hyperexport.api moved to hyperexport.library.api; import its public names from hyperexport",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)

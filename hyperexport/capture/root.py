"""The name published models record for ``RootHolder``: ``hyperexport.capture.root``.

The code is in :mod:`hyperexport.library.capture.root`; the class says this name (``@set_module``,
:mod:`hyperexport.library.public`). Not deprecated: a published model names the class by this
path for as long as the model exists, so the name must resolve
(``tests/library/test_public_homes.py``).
"""

from __future__ import annotations

from hyperexport.library.capture.root import (
    RootHolder as RootHolder,
)

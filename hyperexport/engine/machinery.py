"""Modules that the build's own machinery imports, as opposed to the model's.

A build's keys record the modules loaded when a stage that runs the model finishes
(:mod:`.discovered`). Some of them are loaded by the machinery itself for a setting that never
changes what is built: fsspec for a remote tier. Code that imports such modules runs inside
:func:`machinery`; the modules it loads first are never recorded, so that a build setting
never changes a key.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

#: Names of the modules first imported inside :func:`machinery`.
MACHINERY: set[str] = set()


@contextlib.contextmanager
def machinery() -> Iterator[None]:
    """Modules first imported inside the block belong to the build's machinery.

    A module the model imports too, but that the machinery loaded first, is then not keyed by
    its content; its distribution's version still is, where a stage declares it.
    """
    before = set(sys.modules)
    try:
        yield
    finally:
        MACHINERY.update(set(sys.modules) - before)

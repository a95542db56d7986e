"""Giving memory a finished step no longer uses back to the operating system.

Two things keep it from going back on their own. Python frees an object caught in a reference
cycle (a graph whose nodes and values refer to each other) only when its collector comes
round, which a few large objects do not trigger. And glibc's allocator keeps what was freed
in its heap for later requests rather than returning it: in a stage that compared two models
of a 5 GB build one after the other, 0.43 GB of freed memory stayed in the process (0.54 GB
anonymous, 0.10 GB after ``malloc_trim``) while the next step mapped 4.9 GB of weights.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS: their
    allocators return memory differently; nothing to do there)."""
    name = ctypes.util.find_library("c")
    if name is None:
        log.debug("no C library found: freed memory is left to the allocator")
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError) as e:
        log.debug("no malloc_trim in the C library (%s): freed memory is left to the allocator", e)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_freed_memory() -> None:
    """Collect reference cycles, then hand the allocator's free memory back to the system."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

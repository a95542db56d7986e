"""``return_freed_memory``: collection, and glibc's ``malloc_trim`` where the C library is glibc."""

from __future__ import annotations

import gc
import platform
import weakref

import pytest

from hyperexport.engine import memory


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_reference_cycle_is_gone_after_it() -> None:
    gc.disable()
    try:
        cycle = _Cycle()
        ref = weakref.ref(cycle)
        del cycle
        assert ref() is not None  # only the collector frees a cycle
        memory.return_freed_memory()
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_glibc_has_malloc_trim() -> None:
    trim = memory._malloc_trim()
    assert trim is not None
    assert trim(0) in (0, 1)

"""How many threads this process may use for its numeric work: one fact for torch and ONNX Runtime.

torch reads ``OMP_NUM_THREADS`` (and MKL's) when it is imported; ONNX Runtime does not, and by
default takes a spinning thread per core for every session. Where several processes share the
cores (the jobs of a parallel sweep, ``product/cli/threads.py``; the workers of a parallel test
run), each is given its share through ``OMP_NUM_THREADS``, and every ONNX Runtime session the
library opens reads it from here, so neither runtime oversubscribes the machine.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

#: The environment variables torch's thread pools read when it is imported; the first is the
#: budget ONNX Runtime sessions take too.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_budget() -> int | None:
    """The threads this process was given (``OMP_NUM_THREADS``), or None when it was not given
    one (each runtime then uses its default: every core)."""
    value = os.environ.get(THREAD_VARIABLES[0], "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        log.warning(
            "%s=%r is not a positive whole number: ONNX Runtime keeps its default thread count",
            THREAD_VARIABLES[0],
            value,
        )
        return None
    return int(value)


def give_threads(threads: int) -> None:
    """Set this process's budget (before torch is imported, torch takes it too)."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)

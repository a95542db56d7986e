"""The test run's own process setup (``tests/helpers/worker_process.py``)."""

from __future__ import annotations

import gc
import os

import pytest

from hyperexport.base.thread_budget import thread_budget
from tests.helpers.worker_process import GIVEN, worker_share


def test_each_worker_gets_its_share_of_the_cores() -> None:
    assert worker_share(2, 2) == 1
    assert worker_share(8, 3) == 2
    assert worker_share(2, 4) == 1  # never none
    assert worker_share(4, 0) == 4


def test_this_worker_runs_within_its_share() -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("a serial run keeps the runtimes' default thread counts")
    if GIVEN not in os.environ:
        pytest.skip("the user gave the run its own thread budget (OMP_NUM_THREADS)")
    import torch

    share = worker_share(os.cpu_count() or 1, int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    assert int(os.environ[GIVEN]) == share
    assert thread_budget() == share  # what every ONNX Runtime session of the library takes
    assert torch.get_num_threads() == share


def test_the_imported_libraries_are_out_of_the_collectors_sight() -> None:
    """Frozen after collection and after each test: a full collection walks far fewer
    objects than the process holds."""
    assert gc.get_freeze_count() > len(gc.get_objects()) > 0

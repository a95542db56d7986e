"""A pytest plugin (``-p tests.helpers.worker_process`` in pyproject's ``addopts``): how each
process of a test run is set up for the thousand builds it runs.

- **Cores.** Left alone, each xdist worker's torch takes a thread per core and each of its ONNX
  Runtime sessions a spinning thread per core, so two workers on two cores oversubscribe them
  and burn CPU time waiting on each other. The controller gives every worker ``cores // N``
  threads (at least one) through ``base/thread_budget.py``, before the workers start and import
  torch: the share the jobs of a parallel sweep take (``product/cli/threads.py``). A budget the
  user set (``OMP_NUM_THREADS``) is kept; a serial run keeps the runtimes' defaults.
- **The heap of imports.** A build releases its live model with a full garbage collection
  (``engine/runner.py``), which walks every tracked object: in a test process that has imported
  torch, transformers, ONNX and every test module, millions of them, about 0.2 s a build. After
  the collection and after each test, what is still alive (the imported libraries, above all:
  transformers imports its model classes lazily, in the first test that builds one) is moved out
  of the collector's sight (``gc.freeze``), once the garbage is collected. A test's own objects
  are collected as usual while it runs; what outlives it (a module fixture's model) is kept for
  the rest of the run, a few megabytes of tiny models.
"""

from __future__ import annotations

import gc
import os

import pytest

from hyperexport.base.thread_budget import THREAD_VARIABLES, give_threads

#: Set beside the budget when this plugin gave it (not the user): what the workers may check.
GIVEN = "HYPEREXPORT_TEST_WORKER_THREADS"


def worker_share(cores: int, workers: int) -> int:
    return max(1, cores // max(1, workers))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker: it inherited the controller's share
        return
    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers < 2 or os.environ.get(THREAD_VARIABLES[0]):
        return
    share = worker_share(os.cpu_count() or 1, workers)
    give_threads(share)
    os.environ[GIVEN] = str(share)


def _freeze_survivors() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_survivors()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _freeze_survivors()

"""Jobs side by side share the cores: each takes cores // n_jobs torch threads."""

from __future__ import annotations

import os
import sys
import types

import pytest

from hyperexport.base.thread_budget import THREAD_VARIABLES
from hyperexport.product.cli.threads import (
    default_n_jobs,
    parallel_jobs,
    share_cores,
    with_default_n_jobs,
)


@pytest.mark.parametrize(
    ("launcher", "cores", "expected"),
    [
        ({"n_jobs": 2}, 2, 2),
        ({"n_jobs": 8}, 2, 2),
        ({"n_jobs": -1}, 4, 4),
        ({"n_jobs": -2}, 4, 3),
        ({}, 4, 1),  # the basic launcher: one job at a time
        ({"timeout_min": 60}, 4, 1),  # submitit: jobs elsewhere
        (None, 4, 1),
    ],
)
def test_parallel_jobs(launcher: dict[str, int] | None, cores: int, expected: int) -> None:
    assert parallel_jobs(launcher, cores) == expected


def test_without_torch_the_share_goes_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert share_cores(2, cores=4) == 2
    assert all(os.environ[name] == "2" for name in THREAD_VARIABLES)


def test_with_torch_imported_its_pool_is_resized(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    fake = types.SimpleNamespace(set_num_threads=calls.append)
    monkeypatch.setitem(sys.modules, "torch", fake)
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert share_cores(3, cores=2) == 1
    assert calls == [1]
    assert os.environ[THREAD_VARIABLES[0]] == "1"  # and ONNX Runtime's sessions take it too
    assert share_cores(1, cores=2) == 2 and calls == [1]  # one job: untouched


@pytest.mark.parametrize(
    ("cores", "jobs", "expected"),
    [
        (2, 4, 1),  # two cores: one after the other (each worker would import torch again)
        (4, 4, 2),
        (16, 3, 3),  # never more workers than jobs
        (1, None, 1),
        (8, None, 4),
    ],
)
def test_default_n_jobs(cores: int, jobs: int | None, expected: int) -> None:
    assert default_n_jobs(cores, jobs) == expected


def test_joblib_without_n_jobs_gets_the_default_and_a_given_one_is_kept() -> None:
    args = ["-m", "hydra/launcher=joblib", "opset=15,16,17,18"]
    assert with_default_n_jobs(args, 4, cores=2) == [*args, "hydra.launcher.n_jobs=1"]
    assert with_default_n_jobs(args, 4, cores=8) == [*args, "hydra.launcher.n_jobs=4"]
    given = [*args, "hydra.launcher.n_jobs=2"]
    assert with_default_n_jobs(given, 4, cores=2) == given
    basic = ["-m", "opset=15,16"]
    assert with_default_n_jobs(basic, 2, cores=2) == basic

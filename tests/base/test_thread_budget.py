"""The process's thread budget: OMP_NUM_THREADS, read once for torch and ONNX Runtime."""

from __future__ import annotations

import logging

import pytest

from hyperexport.base.thread_budget import THREAD_VARIABLES, give_threads, thread_budget


def test_no_budget_leaves_the_runtimes_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREAD_VARIABLES[0], raising=False)
    assert thread_budget() is None


def test_a_given_budget_is_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    give_threads(3)
    assert thread_budget() == 3


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_a_budget_that_is_not_a_count_is_ignored_with_a_warning(
    value: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(THREAD_VARIABLES[0], value)
    with caplog.at_level(logging.WARNING, logger="hyperexport.base.thread_budget"):
        assert thread_budget() is None
    assert THREAD_VARIABLES[0] in caplog.text and repr(value) in caplog.text

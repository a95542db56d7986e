"""Every ONNX Runtime session the library opens stays within the process's thread budget."""

from __future__ import annotations

import pytest

from hyperexport.base.thread_budget import THREAD_VARIABLES
from hyperexport.library.check.ort_session import session_options


def test_sessions_take_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THREAD_VARIABLES[0], "1")
    options = session_options()
    assert options.intra_op_num_threads == 1 and options.inter_op_num_threads == 1


def test_without_a_budget_onnx_runtime_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREAD_VARIABLES[0], raising=False)
    assert session_options().intra_op_num_threads == 0  # ONNX Runtime's "one per core"

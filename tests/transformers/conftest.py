"""Shared helpers for the transformers tests: flat-tensor wrappers and ORT parity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn


class LastHidden(nn.Module):
    """Calls a transformers model by keyword with one tensor; returns ``last_hidden_state``."""

    def __init__(self, model: nn.Module, key: str = "input_ids") -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run an ONNX file on ORT's CPU provider."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference; fails on a shape mismatch."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


@pytest.fixture
def last_hidden() -> type[LastHidden]:
    return LastHidden


@pytest.fixture
def ort_run():
    return run_ort


@pytest.fixture
def diff():
    return max_abs_diff

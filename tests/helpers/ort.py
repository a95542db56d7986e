"""Run ONNX models on ONNX Runtime's CPU provider and compare against torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from hyperexport.library.capture import tree

ModelSource = bytes | str | Path | onnx.ModelProto
Feeds = Mapping[str, np.ndarray] | Sequence[np.ndarray]


def session_for(model: ModelSource) -> ort.InferenceSession:
    """An ORT CPU session for serialized bytes, a file path or a ``ModelProto``."""
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"])


def run_ort(model: ModelSource, feeds: Feeds) -> list[np.ndarray]:
    """Run ``model``; ``feeds`` maps input names, or lists arrays in the model's input order."""
    session = session_for(model)
    if not isinstance(feeds, Mapping):
        inputs = session.get_inputs()
        assert len(inputs) == len(feeds), ([i.name for i in inputs], len(feeds))
        feeds = {i.name: x for i, x in zip(inputs, feeds)}
    return session.run(None, dict(feeds))


def flat_outputs(value: Any) -> list[np.ndarray]:
    """Torch outputs (tensors in nested tuples, lists and dicts) flattened in ONNX output order."""
    tensors: list[torch.Tensor] = []
    tree.flatten(value, "output", tensors)
    return [t.detach().numpy() for t in tensors]


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference; fails on a shape mismatch."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def assert_outputs_close(got: Sequence[np.ndarray], model_output: Any, atol: float) -> None:
    """ORT outputs match the torch outputs one for one, within ``atol`` (and as ``rtol``)."""
    want = flat_outputs(model_output)
    assert len(got) == len(want), (len(got), len(want))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=atol, rtol=atol)

"""Helpers shared by the exporter tests: run ONNX Runtime and compare with torch."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from hyperexport.library.capture import tree


def flat_outputs(value: Any) -> list[np.ndarray]:
    tensors: list[torch.Tensor] = []
    tree.flatten(value, "output", tensors)
    return [t.detach().numpy() for t in tensors]


def run_ort(data: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
    return session.run(None, feeds)


def export_bytes(model: torch.nn.Module, args: tuple[Any, ...], **kw: Any) -> tuple[bytes, Any]:
    from hyperexport import export_hyper_onnx

    buffer = io.BytesIO()
    manifest = export_hyper_onnx(model, args, buffer, **kw)
    data = buffer.getvalue()
    onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    return data, manifest


@pytest.fixture(params=["per_instance", "per_type"])
def function_mode(request: pytest.FixtureRequest) -> str:
    return request.param

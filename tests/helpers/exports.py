"""Export with the library entry point into memory, full-checked by onnx."""

from __future__ import annotations

import io
from typing import Any

import onnx
import torch

from hyperexport import export_hyper_onnx
from hyperexport.base.contracts.manifest import ExportManifest


def export_bytes(
    model: torch.nn.Module, args: tuple[Any, ...], **kw: Any
) -> tuple[bytes, ExportManifest]:
    """``export_hyper_onnx`` into a buffer; the model passes ``onnx.checker``'s full check."""
    buffer = io.BytesIO()
    manifest = export_hyper_onnx(model, args, buffer, **kw)
    data = buffer.getvalue()
    onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    return data, manifest

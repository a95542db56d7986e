"""The TorchScript path's bridges to older torch releases (facts: hyperexport/base/versions.py):
each runs on every stack, exercising the bridge where the installed torch needs it."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx_ir.tensor_adapters import TorchTensor
from torch import nn

from hyperexport.base import versions
from hyperexport.library.export import weights
from hyperexport.library.export.torch_exporter import (
    repaired_sdpa_symbolic,
    repaired_where_symbolic,
)
from hyperexport.library.export.torchscript import export_torchscript


class ScaledAttention(nn.Module):
    """SDPA with a given scale that differs from the default (transformers always gives one)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3)


def test_sdpa_with_a_given_scale_exports_and_matches_torch() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with repaired_sdpa_symbolic():  # as the TorchScript path's unit export enters it
        model = export_torchscript(
            ScaledAttention(),
            (q, k, v),
            opset=17,
            input_names=["q", "k", "v"],
            output_names=["y"],
            weights_as_inputs=False,
            dynamic_axes=None,
        )
    import onnx_ir as ir

    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    [got] = session.run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()})
    np.testing.assert_allclose(got, ScaledAttention()(q, k, v).numpy(), atol=1e-5, rtol=1e-4)
    onnx.checker.check_model(proto)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_the_tensor_wrapper_for_torch_before_2_3_reads_like_onnx_irs(dtype: torch.dtype) -> None:
    tensor = (torch.arange(12, dtype=torch.float32) / 7).reshape(3, 4).to(dtype)
    ours = weights._TorchTensorBeforeWideUnsigned(tensor, name="w")
    assert ours.raw is tensor  # no copy
    assert ours.tobytes() == tensor.view(torch.uint8).numpy().tobytes()
    assert ours.numpy().tobytes() == ours.tobytes()
    if hasattr(torch, "uint16"):  # onnx_ir's own wrapper works here: the two agree
        theirs = TorchTensor(tensor, name="w")
        assert ours.dtype == theirs.dtype
        assert ours.numpy().tobytes() == theirs.numpy().tobytes()


def test_the_installed_torch_gets_a_working_wrapper() -> None:
    tensor = torch.ones(2, 3, dtype=torch.bfloat16)
    wrapped = weights.torch_tensor(tensor, "w")
    assert wrapped.name == "w" and wrapped.tobytes() == tensor.view(torch.uint8).numpy().tobytes()


class SlidingWindowMask(nn.Module):
    """transformers 4.48's Gemma2 sliding-window mask: ``where`` with a Python float branch."""

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        outside = torch.tril(torch.ones_like(mask, dtype=torch.bool), diagonal=-2)
        return torch.where(outside, torch.finfo(mask.dtype).min, mask)


def _export_where(repaired: bool) -> bytes:
    import contextlib

    import onnx_ir as ir

    mask = torch.zeros(1, 1, 4, 4)
    with repaired_where_symbolic() if repaired else contextlib.nullcontext():
        model = export_torchscript(
            SlidingWindowMask(),
            (mask,),
            opset=17,
            input_names=["mask"],
            output_names=["y"],
            weights_as_inputs=False,
            dynamic_axes=None,
        )
    return ir.serde.serialize_model(model).SerializeToString()


def test_where_with_a_python_float_branch_exports_and_matches_torch() -> None:
    mask = torch.zeros(1, 1, 4, 4)
    session = ort.InferenceSession(_export_where(repaired=True), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"mask": mask.numpy()})
    np.testing.assert_array_equal(got, SlidingWindowMask()(mask).numpy())


@pytest.mark.skipif(
    not versions.torchscript_where_keeps_double_scalars(),
    reason=f"torch {versions.torch_version()} exports where's scalar in the tensor's type "
    "(versions.TORCHSCRIPT_WHERE_KEEPS_DOUBLE_SCALARS)",
)
def test_without_the_repair_onnx_runtime_refuses_where_of_two_types() -> None:
    with pytest.raises(Exception, match="bound to different types"):
        ort.InferenceSession(_export_where(repaired=False), providers=["CPUExecutionProvider"])

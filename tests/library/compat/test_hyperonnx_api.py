"""``hyperexport.compat.hyperonnx``: HyperONNX's names, defaults and conventions over hyperexport."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from hyperexport.base import versions
from hyperexport.library.compat import hyperonnx
from tests.helpers.ort import flat_outputs, run_ort
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION


class Inner(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: int) -> tuple[torch.Tensor, ...]:
        return x * scale + y, x - y


class Outer(nn.Module):
    """Holds a Conv between its own input and two Inner calls (nodes inside a function)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Conv2d(1, 1, 1)
        self.body = nn.ModuleList([Inner(), Inner()])

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        a, b = x, self.head(x)
        for i, inner in enumerate(self.body):
            a, b = inner(a, b, scale=i + 1)
        return {"a": a, "b": b}


class Top(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.outer(x)


def _export(**kwargs: object) -> tuple[onnx.ModelProto, bytes, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model, x = Top().eval(), torch.randn(1, 1, 2, 2)
    buffer = io.BytesIO()
    hyperonnx.export_hyper_onnx(model, (x,), buffer, input_names=["x"], **kwargs)  # type: ignore[arg-type]
    data = buffer.getvalue()
    return onnx.load_from_string(data), data, model, x


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_defaults_naming_and_parity(dynamo: bool) -> None:
    proto, data, model, x = _export(hiera=[Outer, Inner], dynamo=dynamo)
    onnx.checker.check_model(proto, full_check=True)
    assert hyperonnx.DEFAULT_OPSET == 19
    # HyperONNX's 19, or on the TorchScript path the torch's cap where lower (torch 2.2: 17)
    want = 19 if dynamo else versions.torchscript_opset(19)
    assert {o.domain: o.version for o in proto.opset_import}[""] == want
    module_functions = {f.name for f in proto.functions if not f.name.startswith("Leftover")}
    assert module_functions == {"Outer:0", "Inner:0", "Inner:1"}  # Class:idx
    assert {f.domain for f in proto.functions} == {hyperonnx.HYPER_DOMAIN}
    assert all(
        n.domain == hyperonnx.HYPER_DOMAIN
        for n in proto.graph.node
        if n.op_type[0].isupper() and ":" in n.op_type
    )
    for got, want in zip(run_ort(data, {"x": x.numpy()}), flat_outputs(model(x)), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_unknown_keywords_and_module_spec_are_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        proto, *_ = _export(hiera=[Inner], compile_hier=[Inner], cutlass_tune=True, module_spec={})
    assert "ignored argument(s): compile_hier, cutlass_tune" in caplog.text
    assert "module_spec" in caplog.text
    assert {f.name for f in proto.functions} >= {"Inner:0", "Inner:1"}


def test_dynamic_axes_as_lists_of_axes() -> None:
    proto, *_ = _export(hiera=[Inner], dynamic_axes={"x": [0]}, dynamo=False)
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "x_dim0"


def test_external_data_with_a_file_object_goes_to_external_directory(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).eval()
    x = torch.randn(2, 64)
    buffer = io.BytesIO()
    hyperonnx.export_hyper_onnx(
        model, (x,), buffer, external_data=True, external_directory=tmp_path, hiera=[nn.Linear]
    )
    proto = onnx.load_from_string(buffer.getvalue())
    data_files = list(tmp_path.glob("*.data"))
    assert len(data_files) == 1 and data_files[0].stat().st_size >= 64 * 64 * 4
    onnx.load_external_data_for_model(proto, str(tmp_path))
    (got,) = run_ort(proto, [x.numpy()])
    np.testing.assert_allclose(got, model(x).detach().numpy(), atol=1e-5)


class Stepper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def _step(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.cell(x) + h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros_like(x)
        for _ in range(3):
            h = self._step(x, h)
        return h


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_auto_trace_method_exports_each_recorded_call(dynamo: bool, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Stepper().eval(), torch.randn(1, 4)
    with hyperonnx.auto_trace_method(model._step, expected_stages=2) as tracer:
        with pytest.raises(StopIteration):
            model(x)  # the third call is one too many
        tracer.export(
            tmp_path / "step.onnx", input_names=["x", "h"], hiera=[nn.Linear], dynamo=dynamo
        )
    assert "_step" not in vars(model)  # restored
    first, second = tracer.calls
    for stage, (args, _) in enumerate((first, second)):
        data = (tmp_path / f"step.{stage}.onnx").read_bytes()
        (got,) = run_ort(data, {"x": args[0].numpy(), "h": args[1].numpy()})
        np.testing.assert_allclose(got, model._step(*args).detach().numpy(), atol=1e-6)
    torch.testing.assert_close(second[0][1], model._step(*first[0]))  # the second call's h


@NEEDS_HYPEREXPORT_ATTENTION
def test_promotion_and_registration_names() -> None:
    hyperonnx.register_attention_opsets()
    hyperonnx.register_attention_opsets()  # idempotent
    try:
        from transformers import AttentionInterface

        assert hyperonnx.HYPERONNX_ATTN_IMPL in AttentionInterface._global_mapping
        assert hyperonnx.attention_translation_table()
    finally:
        hyperonnx.unregister_attention_opsets()
    from transformers import AttentionInterface

    assert hyperonnx.HYPERONNX_ATTN_IMPL not in AttentionInterface._global_mapping


def test_the_compat_entry_keeps_hyperonnx_default_of_dynamo_false() -> None:
    import inspect

    assert inspect.signature(hyperonnx.export_hyper_onnx).parameters["dynamo"].default is False

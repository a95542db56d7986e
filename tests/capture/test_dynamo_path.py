"""The dynamo path's placeholder ops and unit export (hyperexport.capture.dynamo)."""

from __future__ import annotations

import io
import logging
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest
import torch
from torch import nn

from hyperexport import export_hyper_onnx
from hyperexport.api import capture_model, export_units
from hyperexport.capture import dynamo
from hyperexport.errors import ModuleExportError
from hyperexport.manifest import META_EXPORT_PATH, META_FALLBACK, PLACEHOLDER_DOMAIN
from hyperexport.options import ExportOptions


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.linear(x)
        return h, h.sum(-1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, s = self.block(x)
        return self.out(h) + s.unsqueeze(-1)


class Passthrough(nn.Module):
    """Returns its input unchanged, and the same tensor twice."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x + 1
        return x, y, y


class DataDependent(nn.Module):
    """Branches on a tensor value: torch.export cannot trace it, the TorchScript tracer can."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.block(x)
        if h.sum() > 0:
            return h * 2
        return h


def _export_bundle(model: nn.Module, x: torch.Tensor, mode: str, out: Path) -> dict[str, ir.Model]:
    capture = capture_model(model, (x,), hiera=[Block])
    bundle = export_units(
        model,
        capture,
        opset=18,
        dynamo=True,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
        out_dir=out,
    )
    return {u.name: ir.load(out / "units" / f"{u.name}.onnx") for u in bundle.units if u.exported}


def test_apply_placeholder_returns_captured_shapes_and_reuses_the_op() -> None:
    outputs = [torch.zeros(2, 3), torch.zeros(5, dtype=torch.int64)]
    first = dynamo.apply_placeholder("P1", [torch.randn(2, 4)], outputs)
    second = dynamo.apply_placeholder("P7", [torch.randn(2, 4)], outputs)
    assert [(t.shape, t.dtype) for t in first] == [(o.shape, o.dtype) for o in outputs]
    assert [(t.shape, t.dtype) for t in second] == [(o.shape, o.dtype) for o in outputs]
    sig = dynamo._signature_of(1, outputs, ())
    assert dynamo._define(sig) is dynamo._define(sig)  # defined once, idempotent


def test_apply_placeholder_computes_dynamic_sizes_from_its_inputs() -> None:
    outputs = [torch.zeros(2, 3)]
    # Output axis 0 follows input 0's axis 0.
    result = dynamo.apply_placeholder("P2", [torch.randn(6, 4)], outputs, [((0, 0), 3)])
    assert result[0].shape == (6, 3)


@pytest.mark.parametrize("mode", ["per_instance", "per_type"])
def test_unit_graphs_carry_one_placeholder_node_and_state_dict_names(
    mode: str, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    units = _export_bundle(Net().eval(), torch.randn(2, 4), mode, tmp_path)
    root = units["root"]
    placeholders = [n for n in root.graph if n.domain == PLACEHOLDER_DOMAIN]
    assert len(placeholders) == 1
    node = placeholders[0]
    assert node.op_type == "P0"
    assert len(node.outputs) == 2
    assert node.inputs[0] is root.graph.inputs[0]
    assert [v.name for v in root.graph.inputs] == ["x"]
    expected_root = {"inner.out.weight", "inner.out.bias"}
    if mode == "per_type":
        # The child's weights are extra placeholder inputs, as initializers by state-dict name.
        assert [v.name for v in node.inputs[1:]] == [
            "inner.block.linear.weight",
            "inner.block.linear.bias",
        ]
        expected_root |= {"inner.block.linear.weight", "inner.block.linear.bias"}
    else:
        assert len(node.inputs) == 1
    assert set(root.graph.initializers) == expected_root
    (child,) = (m for name, m in units.items() if name != "root")
    assert [v.name for v in child.graph.inputs] == ["in.0"]
    assert [v.name for v in child.graph.outputs] == ["out.0", "out.1"]
    assert set(child.graph.initializers) == {"inner.linear.weight", "inner.linear.bias"}


def test_outputs_that_alias_inputs_or_each_other_get_their_own_names() -> None:
    x = torch.randn(2, 3)
    model = Passthrough().eval()
    buffer = io.BytesIO()
    export_hyper_onnx(model, (x,), buffer, dynamo=True, output_names=["a", "b", "c"])
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    assert [o.name for o in proto.graph.output] == ["a", "b", "c"]
    assert [i.name for i in proto.graph.input] == ["x"]


def test_dynamic_axes_without_placeholders_are_named() -> None:
    model = Passthrough().eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        export_hyper_onnx(
            model, (torch.randn(2, 3),), path, dynamo=True, dynamic_axes={"x": {0: "batch"}}
        )
        proto = onnx.load(path)
    dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3]


def test_dynamic_axes_flow_through_placeholders() -> None:
    # The placeholder op computes its dynamic output sizes from its inputs' symbolic sizes.
    import onnxruntime as ort

    torch.manual_seed(0)
    model = Net().eval()
    buffer = io.BytesIO()
    export_hyper_onnx(
        model,
        (torch.randn(2, 4),),
        buffer,
        hiera=[Block],
        dynamo=True,
        dynamic_axes={"x": {0: "batch"}},
    )
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 4)
    (got,) = session.run(None, {"x": x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == (5, 2)
    assert abs(got - want).max() <= 1e-5


def test_failure_names_the_module_and_the_path() -> None:
    with pytest.raises(ModuleExportError, match=r"the root model \(dynamo=True\)"):
        export_hyper_onnx(
            DataDependent().eval(), (torch.randn(2, 4),), io.BytesIO(), hiera=[Block], dynamo=True
        )


def test_fallback_is_logged_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = DataDependent().eval()
    x = torch.randn(2, 4)
    buffer = io.BytesIO()
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        export_hyper_onnx(
            model, (x,), buffer, hiera=[Block], dynamo=True, options=ExportOptions(fallback=True)
        )
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "falling back" in r.getMessage()
    ]
    assert len(warnings) == 1
    assert "dynamo=True" in warnings[0].getMessage()
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta[META_EXPORT_PATH] == "dynamo=False"
    assert meta[META_FALLBACK].startswith("dynamo=True: ModuleExportError")
    assert {f.name for f in proto.functions} == {"Block_block"}


def test_no_fallback_unless_asked() -> None:
    with pytest.raises(ModuleExportError):
        export_hyper_onnx(
            DataDependent().eval(), (torch.randn(2, 4),), io.BytesIO(), hiera=[Block], dynamo=True
        )

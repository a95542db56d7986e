"""The dynamo path's placeholder ops and unit export (hyperexport.library.export.dynamo_program, dynamo_path)."""

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
from hyperexport.base.contracts.manifest import PLACEHOLDER_DOMAIN
from hyperexport.base.errors import InputError, ModuleExportError
from hyperexport.library.api import capture_model, export_units
from hyperexport.library.export import dynamo_path, dynamo_program
from hyperexport.library.options import ExportOptions
from tests.helpers.ort import run_ort


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
    return {u.name: ir.load(out / "units" / f"{u.name}.onnx") for u in bundle.units}


def test_apply_placeholder_returns_captured_shapes_and_reuses_the_op() -> None:
    outputs = [torch.zeros(2, 3), torch.zeros(5, dtype=torch.int64)]
    first = dynamo_program.apply_placeholder("P1", [torch.randn(2, 4)], outputs)
    second = dynamo_program.apply_placeholder("P7", [torch.randn(2, 4)], outputs)
    assert [(t.shape, t.dtype) for t in first] == [(o.shape, o.dtype) for o in outputs]
    assert [(t.shape, t.dtype) for t in second] == [(o.shape, o.dtype) for o in outputs]
    sig = dynamo_program._signature_of(1, outputs, ())
    assert dynamo_program._define(sig) is dynamo_program._define(sig)  # defined once, idempotent


def test_apply_placeholder_computes_dynamic_sizes_from_its_inputs() -> None:
    outputs = [torch.zeros(2, 3)]
    # Output axis 0 follows input 0's axis 0.
    result = dynamo_program.apply_placeholder("P2", [torch.randn(6, 4)], outputs, [((0, 0), 3)])
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
    # In both modes the child's weights are extra placeholder inputs, as initializers by
    # state-dict name (per-instance mode bakes them in later, in SpecializePerInstancePass).
    assert [v.name for v in node.inputs[1:]] == [
        "inner.block.linear.weight",
        "inner.block.linear.bias",
    ]
    expected_root = {"inner.out.weight", "inner.out.bias"}
    expected_root |= {"inner.block.linear.weight", "inner.block.linear.bias"}
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
    x = torch.randn(5, 4)
    (got,) = run_ort(buffer.getvalue(), {"x": x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    assert got.shape == (5, 2)
    assert abs(got - want).max() <= 1e-5


def test_failure_names_the_module_and_the_path() -> None:
    with pytest.raises(ModuleExportError, match=r"the root model \(dynamo=True\)"):
        export_hyper_onnx(
            DataDependent().eval(), (torch.randn(2, 4),), io.BytesIO(), hiera=[Block], dynamo=True
        )


class Outer(nn.Module):
    """Calls two blocks (one of them twice) and reads a block's weight itself."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Block()
        self.second = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.first(x)
        h, s = self.second(h)
        h, _ = self.second(h + s.unsqueeze(-1))
        return h @ self.first.linear.weight.T


class Nested(nn.Module):
    """Root -> Outer -> Block, with a weight tied between the root and a block."""

    def __init__(self) -> None:
        super().__init__()
        self.outer = Outer()
        self.head = nn.Linear(4, 4, bias=False)
        self.head.weight = self.outer.second.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.outer(x))


def _export_nested(out: Path, dynamic: bool) -> dict[str, onnx.ModelProto]:
    torch.manual_seed(0)
    model = Nested().eval()
    axes = (("x", ((0, "batch"),)),) if dynamic else ()
    capture = capture_model(
        model,
        (torch.randn(3, 4),),
        hiera=[Outer, Block],
        dynamic_axes={"x": {0: "batch"}} if dynamic else None,
    )
    options = ExportOptions(functions="per_type", dynamic_axes=axes)
    bundle = export_units(model, capture, opset=18, dynamo=True, options=options, out_dir=out)
    return {u.name: onnx.load(out / "units" / f"{u.name}.onnx") for u in bundle.units}


def _interface(proto: onnx.ModelProto) -> dict[str, object]:
    def dims(values: object) -> list[tuple[str, list[object]]]:
        return [
            (v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values  # type: ignore[attr-defined]
        ]

    return {
        "inputs": dims(proto.graph.input),
        "outputs": dims(proto.graph.output),
        "initializers": sorted(i.name for i in proto.graph.initializer),
        "opsets": sorted(o.domain for o in proto.opset_import),
        "placeholders": sorted(
            n.op_type for n in proto.graph.node if n.domain == PLACEHOLDER_DOMAIN
        ),
    }


def test_all_units_are_one_torch_export(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[object] = []
    export = torch.export.export

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args[0])
        return export(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.export, "export", counting)
    units = _export_nested(tmp_path, dynamic=False)
    assert len(units) == 3  # root, Outer, Block
    assert len(calls) == 1
    for proto in units.values():
        onnx.checker.check_model(proto, full_check=True)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_batched_units_match_units_exported_alone(
    dynamic: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    batched = _export_nested(tmp_path / "batched", dynamic)

    def fail(*args: object) -> None:
        raise RuntimeError("batch disabled by the test")

    monkeypatch.setattr(dynamo_path, "_export", fail)
    alone = _export_nested(tmp_path / "alone", dynamic)
    assert set(batched) == set(alone)
    for name in batched:
        assert _interface(batched[name]) == _interface(alone[name]), name
    root = _interface(batched["root"])
    # The weight tied between the root's head and a block is named by its first path in the
    # root, and the Outer unit names the block weight it reads by its path under Outer.
    assert "inner.outer.second.linear.weight" in root["initializers"]  # type: ignore[operator]
    outer = next(
        m
        for m in batched.values()
        if any(i.name == "inner.first.linear.weight" for i in m.graph.initializer)
    )
    assert PLACEHOLDER_DOMAIN in _interface(outer)["opsets"]  # type: ignore[operator]
    block = next(m for m in batched.values() if not _interface(m)["placeholders"])
    assert _interface(block)["opsets"] == [""]
    assert sorted(i.name for i in block.graph.initializer) == [
        "inner.linear.bias",
        "inner.linear.weight",
    ]
    if dynamic:
        for proto in batched.values():
            assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_batched_export_runs_in_onnxruntime_at_another_shape(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Nested().eval()
    buffer = io.BytesIO()
    export_hyper_onnx(
        model,
        (torch.randn(3, 4),),
        buffer,
        hiera=[Outer, Block],
        dynamo=True,
        dynamic_axes={"x": {0: "batch"}},
        options=ExportOptions(functions="per_type"),
    )
    x = torch.randn(6, 4)
    (got,) = run_ort(buffer.getvalue(), {"x": x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    assert abs(got - want).max() <= 1e-5


class BadBlock(Block):
    """Branches on a tensor value inside a hiera child."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.linear(x)
        if h.sum() > 0:
            h = h * 2
        return h, h.sum(-1)


class BadNet(Net):
    def __init__(self) -> None:
        super().__init__()
        self.block = BadBlock()


def test_a_failing_unit_is_named_without_a_rerun(caplog: pytest.LogCaptureFixture) -> None:
    model = BadNet().eval()
    with (
        caplog.at_level(logging.INFO, logger="hyperexport"),
        pytest.raises(ModuleExportError, match=r"module 'block' \(dynamo=True\)"),
    ):
        export_hyper_onnx(model, (torch.randn(2, 4),), io.BytesIO(), hiera=[BadBlock], dynamo=True)
    assert not [r for r in caplog.records if "unit by unit" in r.getMessage()]
    # Every patched forward is restored.
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_failure_outside_the_units_reruns_them_one_by_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(*args: object) -> None:
        raise RuntimeError("translation failed")

    monkeypatch.setattr(dynamo_path, "_export", fail)
    torch.manual_seed(0)
    model = Net().eval()
    buffer = io.BytesIO()
    with caplog.at_level(logging.WARNING, logger="hyperexport"):
        export_hyper_onnx(model, (torch.randn(2, 4),), buffer, hiera=[Block], dynamo=True)
    assert [r for r in caplog.records if "one by one" in r.getMessage()]
    onnx.checker.check_model(onnx.load_from_string(buffer.getvalue()), full_check=True)


def test_a_specialised_dynamic_dim_is_an_error_not_a_silent_static_dim() -> None:
    # torch.export specialises a traced size of 1; the exported model would then only run at
    # batch 1, so hyperexport refuses and says so.
    with pytest.raises(InputError, match=r"specialised dimension 'batch' to 1"):
        export_hyper_onnx(
            Net().eval(),
            (torch.randn(1, 4),),
            io.BytesIO(),
            hiera=[Block],
            dynamo=True,
            dynamic_axes={"x": {0: "batch"}},
        )


def test_library_functions_left_by_the_exporter_are_inlined_in_a_unit() -> None:
    """onnxscript 0.6.2 on torch 2.13 leaves torch_lib's ``aten_split`` as a function of the
    exported unit; the splice carries hierarchy functions only, so the parent lost its body
    ("No opset import for domain 'pkg.onnxscript.torch_lib'" in ONNX Runtime)."""
    import numpy as np
    from onnx import TensorProto, helper

    body = onnx.helper.make_function(
        "pkg.lib",
        "twice",
        ["x"],
        ["y"],
        [helper.make_node("Add", ["x", "x"], ["y"])],
        [helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [helper.make_node("twice", ["x"], ["y"], domain="pkg.lib")],
        "unit",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(
        graph,
        functions=[body],
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("pkg.lib", 1)],
        ir_version=10,  # what onnxruntime 1.31, its floor, reads
    )
    model = dynamo_program._inline_library_functions(ir.serde.deserialize_model(proto))
    assert not model.functions
    assert [node.op_type for node in model.graph] == ["Add"]
    x = np.arange(2, dtype=np.float32)
    [y] = run_ort(ir.serde.serialize_model(model), {"x": x})
    np.testing.assert_array_equal(y, 2 * x)


def test_a_unit_keeps_the_batch_graphs_initializer_order() -> None:
    """``ir.convenience.extract`` gathers initializers in a set hashed by address: without the
    reordering, their order (and the weight file's) changed from one process to the next."""
    names = [f"w{i}" for i in range(12)]
    batch = ir.Graph([], [], nodes=[], name="batch")
    for name in names:
        value = ir.Value(name=name, const_value=ir.tensor([float(len(name))], name=name))
        batch.initializers.add(value)
    unit = ir.Graph([], [], nodes=[], name="unit")
    for name in reversed(names[2:]):  # a subset, in another order
        unit.initializers.add(ir.Value(name=name, const_value=ir.tensor([1.0], name=name)))
    dynamo_path._order_initializers_as(unit, batch)
    assert list(unit.initializers) == names[2:]


def test_a_clashing_torch_name_is_renamed_the_same_way_in_every_process() -> None:
    x = ir.Value(name="x")
    first = ir.node("Neg", [x])
    second = ir.node("Abs", [first.outputs[0]])
    third = ir.node("Relu", [second.outputs[0]])
    graph = ir.Graph([x], [third.outputs[0]], nodes=[first, second, third])
    first.outputs[0].name = "out"
    second.outputs[0].name = "out__0"  # a name the renaming must not take
    dynamo_program._free_name(graph, "out", third.outputs[0])
    assert first.outputs[0].name == "out__1"


def test_units_name_neither_this_machine_nor_this_process() -> None:
    """The dynamo exporter writes each op's stack trace into its node metadata: absolute paths
    of the checkout and of site-packages, and fx's per-process counters. None of it reaches the
    units, so the same export in another clone or after another export gives the same bytes."""
    import hyperexport

    model, x = Net().eval(), torch.randn(2, 4)
    with tempfile.TemporaryDirectory() as tmp:
        capture = capture_model(model, (x,), hiera=[Block], dynamo=True)
        for out in (Path(tmp), Path(tmp) / "again"):
            export_units(
                model, capture, opset=18, dynamo=True, options=ExportOptions(), out_dir=out
            )
        units = sorted(Path(tmp).glob("units/*.onnx"))
        assert units
        checkout = str(Path(hyperexport.__file__).resolve().parent.parent)
        site = str(Path(torch.__file__).resolve().parent.parent)
        for unit in units:
            data = unit.read_bytes()
            assert checkout.encode() not in data and site.encode() not in data, unit.name
            assert b"eval_with_key" not in data and b"stack_trace" not in data
            keys = {p.key for n in onnx.load_from_string(data).graph.node for p in n.metadata_props}
            assert "namespace" in keys  # what the exporter says about the model stays
            assert (Path(tmp) / "again" / "units" / unit.name).read_bytes() == data

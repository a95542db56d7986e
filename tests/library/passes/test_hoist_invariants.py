"""``passes/hoist_invariants.py``: what every call of a function computes alike from one
main-graph value runs once in the main graph and is passed in; ONNX Runtime computes the same;
the check, running a call alone, computes the moved values again from the call's own inputs
(``check/invariant_inputs.py``). And a fused generation step leaves ONNX Runtime nothing to
change when it loads the model."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN, CallSite
from hyperexport.base.contracts.names import is_invariant_input
from hyperexport.base.errors import CheckError
from hyperexport.library.check.standalone import build_standalone, input_signature
from hyperexport.library.passes.hoist_invariants import HoistInvariantsPass
from tests.helpers.fused_steps import export_fused_step
from tests.helpers.passes import parse
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_GQA_QUERY_SEQLENS,
    NEEDS_HYPEREXPORT_ATTENTION,
    NEEDS_OPSET_18,
)

#: Two layers over one mask: each turns the mask into a bias and a length (the same in both),
#: and scales its own input by its own weight. {second}: the mask the second call gets.
MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[2, 4] x, bool[2, 4] mask, bool[2, 4] other, float[4] w0, float[4] w1)
    => (float[2, 4] y, int64[1] n) {{
    h, n0 = hyperexport.fn.Layer (x, mask, w0)
    y, n = hyperexport.fn.Layer (h, {second}, w1)
}}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Layer (x, mask, w) => (out, length) {{
    zero = Constant <value_float = 0.0> ()
    low = Constant <value_float = -100.0> ()
    bias = Where (mask, zero, low)
    shape = Shape (mask)
    at = Constant <value_ints = [1]> ()
    length = Gather (shape, at)
    scaled = Mul (x, w)
    out = Add (scaled, bias)
}}
"""


def _feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 0, 1], [0, 1, 1, 1]], bool)
    return {
        "x": rng.standard_normal((2, 4)).astype(np.float32),
        "mask": mask,
        "other": ~mask,
        "w0": rng.standard_normal(4).astype(np.float32),
        "w1": rng.standard_normal(4).astype(np.float32),
    }


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def _ops(owner: ir.Graph | ir.Function) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in owner)


def test_what_both_calls_compute_alike_runs_once_in_the_main_graph() -> None:
    model = parse(MODEL.format(second="mask"))
    before = _run(model, _feeds())
    assert HoistInvariantsPass()(model).modified
    [layer] = model.functions.values()
    # the bias and the mask's shape move; the length is an output of the function, so its Gather
    # stays; the weight differs between the calls, so the product stays
    assert _ops(layer) == {"Gather": 1, "Mul": 1, "Add": 1}
    assert _ops(model.graph)["Where"] == 1 and _ops(model.graph)["Layer"] == 2
    moved = [v.name for v in layer.inputs if is_invariant_input(v.name)]
    # the bias, the shape, and the Gather's index (a constant: constants move too)
    assert moved == ["invariant.bias", "invariant.shape", "invariant.at"]
    calls = [n for n in model.graph if n.op_type == "Layer"]
    assert calls[0].inputs[3:] == calls[1].inputs[3:]  # one value, fed to both
    for a, b in zip(_run(model, _feeds()), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not HoistInvariantsPass()(model).modified  # nothing left to move


def test_constants_stay_in_the_bodies_when_asked() -> None:
    model = parse(MODEL.format(second="mask"))
    HoistInvariantsPass(constants=False)(model)
    [layer] = model.functions.values()
    moved = [v.name for v in layer.inputs if is_invariant_input(v.name)]
    assert moved == ["invariant.bias", "invariant.shape"]
    assert _ops(layer)["Constant"] == 1  # the Gather's index


def test_values_the_calls_feed_differently_stay_in_the_function() -> None:
    model = parse(MODEL.format(second="other"))
    before = _run(model, _feeds())
    HoistInvariantsPass()(model)
    [layer] = model.functions.values()
    assert _ops(layer)["Where"] == 1
    assert "Where" not in _ops(model.graph)
    for a, b in zip(_run(model, _feeds()), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_function_called_once_or_from_another_function_is_left_alone() -> None:
    once = parse(MODEL.format(second="mask").replace(
        "y, n = hyperexport.fn.Layer (h, mask, w1)", "y = Identity (h)\n    n = Identity (n0)"
    ))  # fmt: skip
    assert not HoistInvariantsPass()(once).modified
    nested = parse(
        MODEL.format(second="mask")
        .replace(
            '<domain: "hyperexport.fn"',
            """<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.fn" : 1]>
Outer (x, mask, w) => (out, length) {
    out, length = hyperexport.fn.Layer (x, mask, w)
}
<domain: "hyperexport.fn\"""",
        )
        .replace("y, n = hyperexport.fn.Layer", "y, n = hyperexport.fn.Outer")
    )
    assert not HoistInvariantsPass()(nested).modified


def _site(model: ir.Model) -> CallSite:
    return CallSite("c1", "layers.1", FUNCTION_DOMAIN, "Layer", ("x", "mask"), ("w1",), ("y", "n"))


def test_the_check_runs_a_call_alone_computing_its_moved_inputs_from_its_own() -> None:
    model = parse(MODEL.format(second="mask"))
    HoistInvariantsPass()(model)
    feeds = _feeds()
    model.graph.initializers["w1"] = _initializer("w1", feeds["w1"])
    site = _site(model)
    data = [feeds["x"], feeds["mask"]]
    standalone = build_standalone(model, site, input_signature(data))
    assert "Where" in _ops(standalone.graph)  # the bias, from the call's own mask
    proto = ir.to_proto(standalone)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    out, length = session.run(
        None, {"input_0": data[0], "input_1": data[1], "weight_0": feeds["w1"]}
    )
    expected = data[0] * feeds["w1"] + np.where(data[1], 0.0, -100.0).astype(np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert length.tolist() == [4]
    # a different mask for this call gives its own bias, not the main graph's
    flipped = ~data[1]
    out, _ = session.run(None, {"input_0": data[0], "input_1": flipped, "weight_0": feeds["w1"]})
    np.testing.assert_allclose(out, data[0] * feeds["w1"] + np.where(flipped, 0.0, -100.0))


def test_a_moved_input_computed_from_what_the_call_does_not_pass_is_refused() -> None:
    model = parse(MODEL.format(second="mask"))
    HoistInvariantsPass()(model)
    feeds = _feeds()
    model.graph.initializers["w1"] = _initializer("w1", feeds["w1"])
    # point the moved bias at a value computed from a graph input no call passes
    where = next(n for n in model.graph if n.op_type == "Where")
    where.replace_input_with(0, model.graph.inputs[2])  # "other"
    with pytest.raises(CheckError, match="which its call does not pass"):
        build_standalone(model, _site(model), input_signature([feeds["x"], feeds["mask"]]))


def _initializer(name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    return value


@pytest.fixture(scope="module")
def fused_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_fused_step(tmp_path_factory.mktemp("hoisted"), 96)


def _optimized(path: Path, level: ort.GraphOptimizationLevel, out: Path) -> onnx.ModelProto:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(out))


@NEEDS_GQA_QUERY_SEQLENS
@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_DECODING_TASKS
@NEEDS_OPSET_18
def test_a_fused_step_leaves_onnx_runtime_nothing_to_change(
    fused_step: Path, tmp_path: Path
) -> None:
    # A session that fused, merged or shared anything at load runs the same final graph slower
    # than one that found nothing to do (bench/README.md): the layers' functions, inlined, are
    # already what ONNX Runtime's optimisations would make of them.
    model = onnx.load(str(fused_step), load_external_data=False)
    [layer] = model.functions
    assert {"SimplifiedLayerNormalization", "QuickGelu", "GroupQueryAttention"} <= {
        n.op_type for n in layer.node
    }
    assert not any(n.op_type == "Constant" for n in layer.node)
    inlined = _optimized(fused_step, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, tmp_path / "a")
    optimized = _optimized(fused_step, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path / "b")
    # but for the float weights' transposes, which ONNX Runtime folds (the weights are stored as
    # torch holds them; bench/README.md measured that folding within the spread)
    weights = {i.name for i in inlined.graph.initializer}
    transposes = [n for n in inlined.graph.node if n.op_type == "Transpose"]
    assert all(n.input[0] in weights for n in transposes)
    left = _ops_of(inlined)
    left["Transpose"] -= len(transposes)
    assert _ops_of(optimized) == +left
    assert len(optimized.graph.initializer) == len(inlined.graph.initializer)


def _ops_of(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)

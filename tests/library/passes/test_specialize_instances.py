"""SpecializePerInstancePass: shared bodies become per-instance functions with weights baked in."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.library.passes.compose_functions import CHILD_INDEX
from hyperexport.library.passes.specialize_instances import SpecializePerInstancePass
from tests.helpers.passes import run_checked

TEXT = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[2] x) => (float[2] y) <float[2] a_w = {1.0, 2.0}, float[2] b_w = {3.0, 4.0}> {
  h = hyperexport.fn.Scale (x, a_w)
  y = hyperexport.fn.Scale (h, b_w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Scale (x, w) => (out) {
  out = Mul (x, w)
}
"""


def _model() -> ir.Model:
    model = ir.from_proto(onnx.parser.parse_model(TEXT))
    for index, (node, path) in enumerate(zip(model.graph, ["a", "b"])):
        node.name = path
        node.meta[CHILD_INDEX] = index
    return model


def _run(model: ir.Model) -> np.ndarray:
    return run_checked(model, {"x": np.array([1.0, 1.0], dtype=np.float32)})[0]


def _pass() -> SpecializePerInstancePass:
    return SpecializePerInstancePass(
        weights={"Scale": frozenset({"w"})}, classes={"Scale": "toy.Scale"}
    )


def test_each_instance_gets_its_own_function_with_its_weights() -> None:
    model = _model()
    before = _run(model)
    result = _pass()(model)
    assert result.modified
    calls = [(n.op_type, len(n.inputs)) for n in model.graph]
    assert calls == [("Scale_a", 1), ("Scale_b", 1)]
    model.functions.pop(("hyperexport.fn", "Scale", ""))  # the shared body is now unused
    names = sorted(f.name for f in model.functions.values())
    assert names == ["Scale_a", "Scale_b"]
    for function in model.functions.values():
        assert [v.name for v in function.inputs] == ["x"]
        assert [n.op_type for n in function] == ["Constant", "Mul"]
    np.testing.assert_array_equal(_run(model), before)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)


def test_second_run_changes_nothing() -> None:
    model = _model()
    _pass()(model)
    assert not _pass()(model).modified

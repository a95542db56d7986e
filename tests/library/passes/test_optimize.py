"""OptimizeKeepFunctionsPass: onnxscript's optimizer folds inside functions and inlines none."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.library.passes.optimize import (
    OptimizeKeepFunctionsPass,
    _materialize_orphan_constants,
)
from tests.helpers.passes import run_checked

TEXT = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[2] x) => (float[2] y) {
  y = hyperexport.fn.Block (x)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Block (x) => (y) {
  one = Constant <value = float[1] {1.0}> ()
  two = Add (one, one)
  y = Mul (x, two)
}
"""


def _run(model: ir.Model) -> np.ndarray:
    return run_checked(model, {"x": np.array([1.0, 3.0], dtype=np.float32)})[0]


def test_folds_inside_functions_and_keeps_them() -> None:
    model = ir.from_proto(onnx.parser.parse_model(TEXT))
    before = _run(model)
    OptimizeKeepFunctionsPass()(model)
    block = model.functions[("hyperexport.fn", "Block", "")]
    assert "Add" not in [n.op_type for n in block]  # 1 + 1 folded
    assert [n.op_type for n in model.graph] == ["Block"]  # not inlined
    np.testing.assert_array_equal(_run(model), before)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)


def test_orphaned_folded_constants_get_a_home() -> None:
    model = ir.from_proto(onnx.parser.parse_model(TEXT))
    block = model.functions[("hyperexport.fn", "Block", "")]
    mul = next(n for n in block if n.op_type == "Mul")
    orphan = ir.Value(name="folded", const_value=ir.tensor(np.array([2.0], dtype=np.float32)))
    mul.replace_input_with(1, orphan)  # a value with a constant but no producer
    assert _materialize_orphan_constants(model) == 1
    producer = mul.inputs[1].producer()
    assert producer is not None and producer.op_type == "Constant"
    np.testing.assert_array_equal(_run(model), np.array([2.0, 6.0], dtype=np.float32))

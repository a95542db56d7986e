"""PruneFunctionIOPass: unused function inputs and outputs go, with their call sites."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.library.passes.prune_function_io import PruneFunctionIOPass
from tests.helpers.passes import run_checked

TEXT = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[2] x, float[2] z) => (float[2] y) {
  a, b = hyperexport.fn.Outer (x, z)
  y = Relu (a)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.fn" : 1]>
Outer (p, unused) => (out, side) {
  out, extra = hyperexport.fn.Inner (p, p)
  side = Neg (extra)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Inner (u, v) => (r, s) {
  r = Abs (u)
  s = Exp (v)
}
"""


def _model() -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(TEXT))


def _run(model: ir.Model) -> np.ndarray:
    feeds = {v.name: np.array([-1.0, 2.0], dtype=np.float32) for v in model.graph.inputs}
    return run_checked(model, feeds)[0]


def test_unused_outputs_then_inputs_are_pruned_through_nesting() -> None:
    model = _model()
    before = _run(model)
    assert PruneFunctionIOPass()(model).modified
    outer = model.functions[("hyperexport.fn", "Outer", "")]
    inner = model.functions[("hyperexport.fn", "Inner", "")]
    # Outer's `side` output is unused by the main graph, so Neg and Inner's `s` die, and then
    # Inner's `v` and Outer's `unused` have no reader.
    assert [v.name for v in outer.outputs] == ["out"]
    assert [v.name for v in outer.inputs] == ["p"]
    assert [v.name for v in inner.outputs] == ["r"]
    assert [v.name for v in inner.inputs] == ["u"]
    call = next(iter(model.graph))
    assert len(call.inputs) == 1 and len(call.outputs) == 1
    np.testing.assert_array_equal(_run(model), before)
    onnx.checker.check_model(ir.to_proto(model), full_check=True)


def test_second_run_changes_nothing() -> None:
    model = _model()
    PruneFunctionIOPass()(model)
    assert not PruneFunctionIOPass()(model).modified


def test_an_output_used_at_one_call_site_is_kept() -> None:
    text = TEXT.replace(
        "  y = Relu (a)\n}",
        "  c, d = hyperexport.fn.Outer (x, z)\n  y0 = Relu (a)\n  y = Add (y0, d)\n}",
    )
    model = ir.from_proto(onnx.parser.parse_model(text))
    PruneFunctionIOPass()(model)
    outer = model.functions[("hyperexport.fn", "Outer", "")]
    assert [v.name for v in outer.outputs] == ["out", "side"]

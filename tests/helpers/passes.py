"""What the pass tests share: parse ONNX text, run a model checked in ORT, and apply a pass
asserting unchanged outputs and a no-op second run."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from tests.helpers.ort import session_for


def parse(text: str) -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(text))


def run_checked(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Full-check the model, then run it in ORT on the feeds it takes."""
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    session = session_for(proto)
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


def apply_preserving(
    make_pass: Callable[[], ir.passes.PassBase], text: str, feeds: Mapping[str, np.ndarray]
) -> tuple[ir.Model, bool]:
    """Run the pass on ``text``; assert ORT outputs are unchanged and a second run is a no-op."""
    model = parse(text)
    before = run_checked(model, feeds)
    modified = make_pass()(model).modified
    after = run_checked(model, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not make_pass()(model).modified
    return model, modified


# A model with a per-type function and a main-graph RMSNorm: the fusion tests' shared case.
HEADER = '<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>'

# TorchScript's form (a no-op Cast, Div(1, .), the weight first), in a per-type function
# called twice; the model's final norm, in the main graph, is dynamo's (Reciprocal).
RMS = (
    HEADER
    + """
agraph (float[2,5,16] x, float[16] w) => (float[2,5,16] y) {
    h = hyperexport.fn.Norm (x, w)
    g = hyperexport.fn.Norm (h, w)
    two = Constant <value = float {2.0}> ()
    axes = Constant <value = int64[1] {-1}> ()
    sq = Pow (g, two)
    mean = ReduceMean <keepdims: int = 1> (sq, axes)
    eps = Constant <value = float {1e-5}> ()
    var = Add (mean, eps)
    rms = Sqrt (var)
    inv = Reciprocal (rms)
    normed = Mul (g, inv)
    y = Mul (normed, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Norm (x, w) => (out) {
    xc = Cast <to: int = 1> (x)
    two = Constant <value = float {2.0}> ()
    sq = Pow (xc, two)
    axes = Constant <value = int64[1] {-1}> ()
    mean = ReduceMean <keepdims: int = 1> (sq, axes)
    eps = Constant <value = float {1e-6}> ()
    var = Add (eps, mean)
    rms = Sqrt (var)
    one = Constant <value = float {1.0}> ()
    inv = Div (one, rms)
    normed = Mul (xc, inv)
    out = Mul (w, normed)
}
"""
)

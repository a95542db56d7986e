"""What the fusion rules read off values: small constants through the TorchScript path's
Unsqueeze/Concat/Cast chains, and shapes inferred for a rewrite and taken off again."""

from __future__ import annotations

import onnx_ir as ir

from hyperexport.library.passes.fuse_values import (
    annotated,
    constant_array,
    ints,
    scalar,
    static_dim,
)
from tests.helpers.passes import parse

CHAIN = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[2,3,8] x) => (float[2,3,8] y) {
    a = Constant <value = int64 {8}> ()
    zero = Constant <value = int64[1] {0}> ()
    b = Unsqueeze (a, zero)
    c = Constant <value_ints = [1]> ()
    d = Concat <axis: int = 0> (c, b)
    e = Cast <to: int = 1> (d)
    y = Mul (x, e)
}
"""

FUNCTION = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
agraph (float[2,3,8] x, float[8,16] w) => (float[2,3,4,4] y) {
    y = hyperexport.fn.Heads (x, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.attention" : 1]>
Heads (x, w) => (out) {
    p = MatMul (x, w)
    shape = Constant <value_ints = [0, 0, -1, 4]> ()
    r = Reshape (p, shape)
    a = hyperexport.attention.Attention <scale: float = 0.5> (r, r, r)
    out = Relu (a)
}
"""


def _value(model: ir.Model, name: str) -> ir.Value:
    owners = [model.graph, *model.functions.values()]
    return next(v for o in owners for n in o for v in n.outputs if v.name == name)


def test_constants_are_evaluated_through_unsqueeze_concat_and_cast() -> None:
    model = parse(CHAIN)
    assert ints(_value(model, "d")) == [1, 8]
    assert constant_array(_value(model, "e")).tolist() == [1.0, 8.0]  # type: ignore[union-attr]
    assert scalar(_value(model, "a")) == 8.0
    assert constant_array(_value(model, "y")) is None  # it depends on the input


def test_shapes_are_inferred_through_the_attention_node_and_taken_off_again() -> None:
    model = parse(FUNCTION)
    [heads] = model.functions.values()
    x, r, out = heads.inputs[0], _value(model, "r"), _value(model, "out")
    assert x.shape is None and r.shape is None
    with annotated(model):
        # The function's inputs from its call, the body through the attention node.
        assert x.shape == ir.Shape([2, 3, 8]) and x.dtype == ir.DataType.FLOAT
        assert static_dim(r, 2) == 4 and static_dim(r, 3) == 4
        assert out.shape == ir.Shape([2, 3, 4, 4])
    assert x.shape is None and x.type is None and r.shape is None and out.shape is None

"""``passes/shared_sizes.py``: sizes and ``CastLike`` types read off the inputs every call of a
function shares, so that after inlining one copy of that arithmetic serves every layer.

A small model as ONNX text: a function called twice with the same ``mask`` and its own ``x``,
computing what a fused layer computes for its kernels (the batch and the new tokens from the
layer's own value, a length picked out of a ``Concat`` of the past's sizes, a bias typed like the
layer's value). After the pass the model computes the same outputs, and those reads take only
the shared input (or constants)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.library.passes.shared_sizes import ReadSharedSizesPass, shared_inputs

MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[B, S, 4] x0, float[B, S, 4] x1, bool[B, 1, S, T] mask, float[B, 2, P, 4] past)
   => (float[B, S, 4] y0, float[B, S, 4] y1, int64[2] sizes0, float[B, 1, S, T] bias0,
       int64[1] length0) {
    y0, sizes0, bias0, length0 = hyperexport.fn.Layer (x0, mask, past)
    y1, sizes1, bias1, length1 = hyperexport.fn.Layer (x1, mask, past)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Layer (x, mask, past) => (y, sizes, bias, length) {
    shape = Shape (x)
    zero = Constant <value_ints = [0]> ()
    batch = Gather <axis = 0> (shape, zero)
    new = Shape <start = 1, end = 2> (x)
    sizes = Concat <axis = 0> (batch, new)
    lowest = Constant <value_float = -3.0> ()
    nothing = Constant <value_float = 0.0> ()
    low = CastLike (lowest, x)
    none = CastLike (nothing, x)
    bias = Where (mask, none, low)
    head = Shape <start = 0, end = 2> (past)
    total = Shape <start = 3, end = 4> (mask)
    valid = Sub (total, new)
    tail = Shape <start = 3> (past)
    assembled = Concat <axis = 0> (head, valid, tail)
    two = Constant <value_int = 2> ()
    picked = Gather <axis = 0> (assembled, two)
    one = Constant <value_ints = [1]> ()
    length = Reshape (picked, one)
    y = Add (x, x)
}
"""


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = ir.to_proto(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _reads(function: ir.Function) -> dict[str, set[str]]:
    """What the function's ``Shape`` nodes size and its ``CastLike`` nodes type."""
    reads: dict[str, set[str]] = {"Shape": set(), "CastLike": set()}
    for node in function:
        if node.op_type == "Shape":
            reads["Shape"].add(node.inputs[0].name or "")
        elif node.op_type == "CastLike":
            reads["CastLike"].add(node.inputs[1].name or "")
    return reads


def test_sizes_and_types_come_from_the_shared_input_and_the_outputs_stay() -> None:
    model = ir.serde.deserialize_model(onnx.parser.parse_model(MODEL))
    rng = np.random.default_rng(0)
    feeds = {
        "x0": rng.standard_normal((2, 3, 4), dtype=np.float32),
        "x1": rng.standard_normal((2, 3, 4), dtype=np.float32),
        "mask": rng.random((2, 1, 3, 5)) > 0.5,
        "past": rng.standard_normal((2, 2, 7, 4), dtype=np.float32),
    }
    expected = _run(model, feeds)
    [function] = model.functions.values()
    assert [v.name for v in shared_inputs(model)[function.identifier()]] == ["mask", "past"]
    assert _reads(function) == {"Shape": {"x", "mask", "past"}, "CastLike": {"x"}}

    assert ReadSharedSizesPass()(model).modified
    RemoveUnusedNodesPass()(model)

    # x's batch and new tokens are the mask's (the same named dimensions); the length is read
    # from the piece of the Concat that holds it, so the past's own sizes are no longer read;
    # the bias is typed like the shared float input (the mask is boolean).
    assert _reads(function) == {"Shape": {"mask"}, "CastLike": {"past"}}
    for got, want in zip(_run(model, feeds), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not ReadSharedSizesPass()(model).modified  # nothing left to move


def test_a_dimension_named_otherwise_is_left_alone() -> None:
    text = MODEL.replace(
        "float[B, S, 4] x0, float[B, S, 4] x1", "float[N, S, 4] x0, float[N, S, 4] x1"
    )
    text = text.replace(
        "(float[B, S, 4] y0, float[B, S, 4] y1", "(float[N, S, 4] y0, float[N, S, 4] y1"
    )
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    [function] = model.functions.values()
    ReadSharedSizesPass()(model)
    RemoveUnusedNodesPass()(model)
    # the batch of x (N) is not the mask's (B): still read off x; S is shared
    assert "x" in _reads(function)["Shape"]

"""``passes/fuse_attention._heads``: the head count of a query or key where shape inference left
dim 1 unknown (dynamic axes meet ``view(batch, seq, -1, head_dim)``), read from the ops that
made it. The two layouts here are the generate recipes' that the TorchScript path once refused
(issue 35: "the head counts are unknown"): Qwen3's per-head RMS norm between the split and the
transpose, and Phi-3's packed projection, sliced by constants, then rotated on part of the head
size and concatenated back."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from hyperexport.library.passes.fuse_attention import _heads
from hyperexport.library.passes.fuse_values import annotated

#: {part}: what the heads are split from; {head}: what runs between the split and the transpose.
MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[batch, seq, 128] qkv) => (float[batch, heads, seq, 16] q) {{
    q = hyperexport.fn.Heads (qkv)
}}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Heads (qkv) => (q) {{
    {part}
    shape = Shape (qkv)
    zero = Constant <value_ints = [0]> ()
    one = Constant <value_ints = [1]> ()
    batch = Gather <axis = 0> (shape, zero)
    seq = Gather <axis = 0> (shape, one)
    rest = Constant <value_ints = [-1, 16]> ()
    target = Concat <axis = 0> (batch, seq, rest)
    split = Reshape (part, target)
    {head}
    t = Transpose <perm = [0, 2, 1, 3]> (normed)
    lo = Constant <value_ints = [0]> ()
    mid = Constant <value_ints = [8]> ()
    end = Constant <value_ints = [16]> ()
    last = Constant <value_ints = [-1]> ()
    rotated_part = Slice (t, lo, mid, last)
    kept_part = Slice (t, mid, end, last)
    rotated = Neg (rotated_part)
    q = Concat <axis = -1> (rotated, kept_part)
}}
"""
PACKED = """starts = Constant <value_ints = [0]> ()
    ends = Constant <value_ints = [64]> ()
    axes = Constant <value_ints = [-1]> ()
    part = Slice (qkv, starts, ends, axes)"""
WHOLE = "part = Identity (qkv)"
NO_NORM = "normed = Identity (split)"
PER_HEAD_NORM = """two = Constant <value_float = 2.0> ()
    squared = Pow (split, two)
    axis = Constant <value_ints = [-1]> ()
    mean = ReduceMean <keepdims = 1> (squared, axis)
    eps = Constant <value_float = 0.000001> ()
    shifted = Add (mean, eps)
    root = Sqrt (shifted)
    scaled = Div (split, root)
    weight = Constant <value = float[16] {1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1}> ()
    normed = Mul (weight, scaled)"""


def _heads_of_q(part: str, head: str) -> int | None:
    text = MODEL.format(part=part, head=head)
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    [function] = model.functions.values()
    with annotated(model):
        return _heads(function.outputs[0])


def test_the_heads_of_a_sliced_packed_projection_rotated_in_part() -> None:
    # Phi-3: 64 of the packed 128 are the query's, 16 per head
    assert _heads_of_q(PACKED, NO_NORM) == 4


def test_the_heads_through_a_per_head_norm() -> None:
    # Qwen3: RMS norm over each head's 16 values between the split and the transpose
    assert _heads_of_q(WHOLE, PER_HEAD_NORM) == 8
    assert _heads_of_q(PACKED, PER_HEAD_NORM) == 4


def test_a_slice_by_a_dynamic_size_leaves_the_count_unknown() -> None:
    # the query's width is the sequence length here, known only at run time
    dynamic = PACKED.replace(
        "ends = Constant <value_ints = [64]> ()", "ends = Shape <start = 1, end = 2> (qkv)"
    )
    assert _heads_of_q(dynamic, NO_NORM) is None

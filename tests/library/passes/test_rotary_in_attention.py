"""``passes/rotary_in_attention.py``: a generation step's two rotations fold into its
GroupQueryAttention (``do_rotary``) on the packed projection, and ONNX Runtime computes the same
outputs and presents for a left-padded prompt and the decode step after it; what the kernel
cannot rotate the same way stays as it was.

A layer function as ``rewrite.fuse=onnxruntime`` leaves it, in ONNX text: the packed projection
split into query, key and value, each rotation reading its own copy of the per-token tables and
of their row numbers (as ``fuse_rotary`` writes them), the attention over shared buffers with
``query_seqlens``, and sizes and types read off the query and the rotated key as the fusion rules
and the shared buffer read them (a full ``Shape`` and a ``Gather`` of the batch, a ``CastLike``,
a ``Shape`` of the new rows)."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from hyperexport.library.passes.ort_kernels import gqa_rotates_by_position_ids
from hyperexport.library.passes.rotary_in_attention import RotaryInAttentionPass
from tests.helpers.release_skips import NEEDS_GQA_QUERY_SEQLENS

HEAD, HEADS, KV_HEADS, HIDDEN, BUFFER = 16, 2, 1, 32, 8
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD

#: {head}: the tables' width (half the head size); {key_positions}: the key rotation's row
#: numbers ("" to number them as the query's are); {seqlens}: the attention's query_seqlens.
MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[batch, seq, 32] x, float[batch, seq, 16] cos, float[batch, seq, 16] sin,
      float[batch, 1, seq, total] bias, float[batch, 1, buffer, 16] past_key,
      float[batch, 1, buffer, 16] past_value)
    => (float[batch, seq, 32] y, float[batch, 1, buffer, 16] present_key,
        float[batch, 1, buffer, 16] present_value) {{
    y, present_key, present_value = hyperexport.fn.Step (x, cos, sin, bias, past_key, past_value)
}}
<domain: "hyperexport.fn", opset_import: ["" : 18, "com.microsoft" : 1]>
Step (x, cos, sin, bias, past_key, past_value) => (y, present_key, present_value) {{
    weight = Constant <value = float[32, 64] {weights}> ()
    qkv = MatMul (x, weight)
    sizes = Constant <value_ints = [32, 16, 16]> ()
    q, k, v = Split <axis = -1> (qkv, sizes)
    start = Constant <value_ints = [0]> ()
    half = Constant <value_ints = [{head}]> ()
    last = Constant <value_ints = [-1]> ()
    width = Constant <value_ints = [-1, {head}]> ()
    q_cos_half = Slice (cos, start, half, last)
    q_cos = Reshape (q_cos_half, width)
    q_sin_half = Slice (sin, start, half, last)
    q_sin = Reshape (q_sin_half, width)
    k_cos_half = Slice (cos, start, half, last)
    k_cos = Reshape (k_cos_half, width)
    k_sin_half = Slice (sin, start, half, last)
    k_sin = Reshape (k_sin_half, width)
    batch_seq = Shape <start = 0, end = 2> (cos)
    zero = Constant <value_int = 0> ()
    one = Constant <value_int = 1> ()
    rows = ReduceProd <keepdims = 0> (batch_seq)
    q_numbers = Range (zero, rows, one)
    q_positions = Reshape (q_numbers, batch_seq)
    {key_positions}
    {rotations}
    total = Shape <start = 3, end = 4> (bias)
    q_shape = Shape (q)
    first = Constant <value_ints = [0]> ()
    batch = Gather <axis = 0> (q_shape, first)
    nothing = Constant <value_float = 0.0> ()
    typed = CastLike (nothing, q)
    typed_bias = Add (bias, typed)
    new = Shape <start = 1, end = 2> (k_rotated)
    one_row = Constant <value_ints = [1]> ()
    last_row = Sub (total, one_row)
    seqlens_k = Expand (last_row, batch)
    seqlens = Cast <to = 6> (seqlens_k)
    total_n = Squeeze (total)
    total32 = Cast <to = 6> (total_n)
    new_rows = Expand (new, batch)
    query_seqlens = Cast <to = 6> (new_rows)
    attended, present_key, present_value = com.microsoft.GroupQueryAttention <num_heads = 2,
        kv_num_heads = 1> (q_rotated, k_rotated, v, past_key, past_value, seqlens, total32, ,
        , , typed_bias, , , , , , {seqlens})
    y = Identity (attended)
}}
"""

#: The rotations on the projections themselves, as fuse_layout leaves them.
ON_PROJECTIONS = """q_rotated = com.microsoft.RotaryEmbedding <interleaved = 0> (q, q_positions, q_cos, q_sin)
    k_rotated = com.microsoft.RotaryEmbedding <interleaved = 0> (k, k_positions, k_cos, k_sin)"""
#: The rotations of heads first, swapped back and merged, as after Qwen3's per-head norm (the
#: TorchScript path reads the merged shape off the rotation; the new rows, off the key).
HEADS_FIRST = """q_split = Constant <value_ints = [0, 0, 2, 16]> ()
    k_split = Constant <value_ints = [0, 0, 1, 16]> ()
    merge = Constant <value_ints = [0, 0, -1]> ()
    q_heads = Reshape (q, q_split)
    k_heads = Reshape (k, k_split)
    q_first = Transpose <perm = [0, 2, 1, 3]> (q_heads)
    k_first = Transpose <perm = [0, 2, 1, 3]> (k_heads)
    q_turned = com.microsoft.RotaryEmbedding <interleaved = 0> (q_first, q_positions, q_cos, q_sin)
    k_turned = com.microsoft.RotaryEmbedding <interleaved = 0> (k_first, k_positions, k_cos, k_sin)
    q_back = Transpose <perm = [0, 2, 1, 3]> (q_turned)
    k_back = Transpose <perm = [0, 2, 1, 3]> (k_turned)
    q_batch = Shape <start = 0, end = 1> (q_turned)
    q_seq = Shape <start = 2, end = 3> (q_turned)
    rest = Constant <value_ints = [-1]> ()
    q_merge = Concat <axis = 0> (q_batch, q_seq, rest)
    q_rotated = Reshape (q_back, q_merge)
    k_rotated = Reshape (k_back, merge)"""
SAME_POSITIONS = """k_numbers = Range (zero, rows, one)
    k_positions = Reshape (k_numbers, batch_seq)"""


def _model(
    head: int = HEAD // 2,
    key_positions: str = SAME_POSITIONS,
    seqlens: str = "query_seqlens",
    rotations: str = ON_PROJECTIONS,
) -> onnx.ModelProto:
    weights = np.random.default_rng(0).standard_normal((HIDDEN, WIDTH)) / 4
    text = MODEL.format(
        weights="{" + ", ".join(f"{w:.6f}" for w in weights.ravel()) + "}",
        head=head,
        key_positions=key_positions,
        seqlens=seqlens,
        rotations=rotations,
    )
    return onnx.parser.parse_model(text)


def _folded(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    model = ir.serde.deserialize_model(proto)
    result = RotaryInAttentionPass()(model)
    return ir.serde.serialize_model(model), result.modified


def _ops(proto: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for f in proto.functions for n in f.node)


def _run(proto: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _step(
    mask: np.ndarray, new: int, pasts: tuple[np.ndarray, np.ndarray], seed: int
) -> dict[str, np.ndarray]:
    """One step's inputs as transformers makes them: positions from the mask (padding at 1),
    per-token tables of those positions, the mask as a bias."""
    positions = np.cumsum(mask, -1) - 1
    positions[mask == 0] = 1
    positions = positions[:, -new:]
    angles = positions[..., None] * (10000.0 ** (-np.arange(HEAD // 2) / (HEAD // 2)))
    angles = np.concatenate([angles, angles], -1).astype(np.float32)
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -3.4e38).astype(np.float32)
    batch = mask.shape[0]
    return {
        "x": np.random.default_rng(seed).standard_normal((batch, new, HIDDEN)).astype(np.float32),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
        "bias": np.broadcast_to(bias, (batch, 1, new, mask.shape[1])).copy(),
        "past_key": pasts[0],
        "past_value": pasts[1],
    }


LAYOUTS = pytest.mark.parametrize(
    "rotations", [ON_PROJECTIONS, HEADS_FIRST], ids=["on the projections", "heads first"]
)


@LAYOUTS
@NEEDS_GQA_QUERY_SEQLENS
def test_the_rotations_fold_into_attention(rotations: str) -> None:
    """On the projections, the attention then takes the packed projection (no Split); heads
    first, it takes the heads merged again (the swap back goes; the swap before the rotation
    stays only for the Shape that read the rotation), and the projection stays split."""
    before = _model(rotations=rotations)
    after, modified = _folded(before)
    assert modified
    ops = _ops(after)
    assert ops["RotaryEmbedding"] == 0
    assert ops["Transpose"] == (0 if rotations == ON_PROJECTIONS else 1)
    [attention] = [n for f in after.functions for n in f.node if n.op_type == "GroupQueryAttention"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in attention.attribute}
    assert attributes["do_rotary"] == 1 and attributes["rotary_interleaved"] == 0
    assert all(attention.input[i] for i in (7, 8, 9))  # tables and their row numbers
    packed = rotations == ON_PROJECTIONS
    assert ops["Split"] == (0 if packed else 1)
    assert (attention.input[1] == attention.input[2] == "") is packed


@LAYOUTS
@NEEDS_GQA_QUERY_SEQLENS
def test_a_left_padded_prompt_and_the_decode_after_it_compute_the_same(rotations: str) -> None:
    before = _model(rotations=rotations)
    after, _ = _folded(before)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    empty = np.zeros((2, KV_HEADS, BUFFER, HEAD), np.float32)
    prompt = _step(mask, 5, (empty, empty), seed=1)
    expected, got = _run(before, prompt), _run(after, prompt)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)
    # the padded row's keys are rotated by its own positions: not by the token's index
    assert not np.allclose(got[1][1, :, 2], got[1][0, :, 0], atol=1e-3)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
    decode = _step(mask, 1, (expected[1], expected[2]), seed=2)
    for e, g in zip(_run(before, decode), _run(after, decode), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


SHIFTED_POSITIONS = """past_rows = Add (rows, one)
    k_numbers = Range (one, past_rows, one)
    k_positions = Reshape (k_numbers, batch_seq)"""


@pytest.mark.parametrize(
    ("key_positions", "seqlens", "head", "reason"),
    [
        (SHIFTED_POSITIONS, "query_seqlens", HEAD // 2, "rotated differently"),
        (SAME_POSITIONS, "", HEAD // 2, "has no query_seqlens"),
        (SAME_POSITIONS, "query_seqlens", 4, "head size 8, not a multiple of 16"),
    ],
    ids=["key rotated by other rows", "no query_seqlens", "head of 8"],
)
@NEEDS_GQA_QUERY_SEQLENS
def test_what_the_kernel_would_rotate_otherwise_stays(
    key_positions: str, seqlens: str, head: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="hyperexport"):
        after, _ = _folded(_model(head, key_positions, seqlens))
    assert _ops(after)["RotaryEmbedding"] == 2 and _ops(after)["Split"] == 1
    [attention] = [n for f in after.functions for n in f.node if n.op_type == "GroupQueryAttention"]
    assert "do_rotary" not in {a.name for a in attention.attribute}
    assert reason in caplog.text


def test_the_kernel_is_asked_whether_it_rotates_by_position_ids() -> None:
    """The probe's answer is ONNX Runtime's: on a release with query_seqlens (the pinned one),
    yes; without query_seqlens there is no fold to ask for."""
    from hyperexport.library.passes.ort_kernels import gqa_takes_query_seqlens

    assert gqa_rotates_by_position_ids() is gqa_takes_query_seqlens()

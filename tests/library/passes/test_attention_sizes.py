"""``passes/attention_sizes.py``: a fused step's GroupQueryAttention sizes, computed from the
mask's shape as the fusion rules and the shared buffer leave them (the past's valid length plus
the new tokens, reshaped, broadcast and cast), are computed again in the fewest kernels, and ONNX
Runtime gives the same outputs and presents; sizes that read anything else, or that are not the
kernel's contract, stay."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from hyperexport.library.passes.attention_sizes import AttentionSizesPass
from tests.helpers.release_skips import NEEDS_GQA_QUERY_SEQLENS

#: A layer's attention over a shared buffer; {batch}: what the sizes are broadcast to,
#: {last}: what seqlens_k is before its cast.
MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[batch, seq, 64] qkv, bool[batch, 1, seq, total] mask,
      float[batch, 1, past, 16] past_key, float[batch, 1, past, 16] past_value)
    => (float[batch, seq, 32] y, float[batch, 1, total, 16] present_key,
        float[batch, 1, total, 16] present_value) {{
    y, present_key, present_value = hyperexport.fn.Step (qkv, mask, past_key, past_value)
}}
<domain: "hyperexport.fn", opset_import: ["" : 18, "com.microsoft" : 1]>
Step (qkv, mask, past_key, past_value) => (y, present_key, present_value) {{
    zero = Constant <value_float = 0.0> ()
    low = Constant <value_float = -3.4e38> ()
    bias = Where (mask, zero, low)
    total_1 = Shape <start = 3, end = 4> (mask)
    new_1 = Shape <start = 2, end = 3> (mask)
    valid = Sub (total_1, new_1)
    first = Constant <value_int = 0> ()
    valid_s = Gather (valid, first)
    shape = Shape (mask)
    at_new = Constant <value_int = 2> ()
    new_s = Gather (shape, at_new)
    total_s = Add (valid_s, new_s)
    total32 = Cast <to = 6> (total_s)
    at_batch = Constant <value_ints = [0]> ()
    {batch}
    row = Constant <value_ints = [1]> ()
    t1 = Reshape (total_s, row)
    {last}
    wide = Expand (last, b)
    seqlens = Cast <to = 6> (wide)
    rows = Expand (new_s, b)
    query = Cast <to = 6> (rows)
    y, present_key, present_value = com.microsoft.GroupQueryAttention <num_heads = 2,
        kv_num_heads = 1> (qkv, , , past_key, past_value, seqlens, total32, , , , bias, , , , ,
        , query)
}}
"""
OFF_THE_MASK = "b = Gather (shape, at_batch)"
OFF_THE_PROJECTION = """projected = Shape (qkv)
    b = Gather (projected, at_batch)"""
LAST = "last = Sub (t1, row)"
TOTAL = "last = Identity (t1)"


def _model(batch: str = OFF_THE_MASK, last: str = LAST) -> ir.Model:
    return ir.serde.deserialize_model(onnx.parser.parse_model(MODEL.format(batch=batch, last=last)))


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _feeds(
    mask: np.ndarray, new: int, pasts: tuple[np.ndarray, np.ndarray]
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(new)
    return {
        "qkv": rng.standard_normal((mask.shape[0], new, 64)).astype(np.float32),
        "mask": np.broadcast_to(
            mask[:, None, None, :] > 0, (mask.shape[0], 1, new, mask.shape[1])
        ).copy(),
        "past_key": pasts[0],
        "past_value": pasts[1],
    }


def _ops(model: ir.Model) -> Counter[str]:
    return Counter(n.op_type for f in model.functions.values() for n in f)


@NEEDS_GQA_QUERY_SEQLENS
def test_the_sizes_are_read_off_the_mask_in_fewer_kernels_and_compute_the_same() -> None:
    before, after = _model(), _model()
    assert AttentionSizesPass()(after).modified
    [attention] = [
        n for f in after.functions.values() for n in f if n.op_type == "GroupQueryAttention"
    ]
    for slot in (5, 6, 16):  # seqlens_k, total_sequence_length, query_seqlens
        assert "_sizes_" in (attention.inputs[slot].producer().name or "")  # type: ignore[union-attr]
    was, now = _ops(before), _ops(after)
    assert sum(now.values()) - now["Constant"] < sum(was.values()) - was["Constant"]
    assert now["Reshape"] == 0 and now["Add"] == 0
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    empty = np.zeros((2, 1, 0, 16), np.float32)
    prompt = _feeds(mask, 5, (empty, empty))
    expected, got = _run(before, prompt), _run(after, prompt)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
    decode = _feeds(mask, 1, (expected[1], expected[2]))
    for e, g in zip(_run(before, decode), _run(after, decode), strict=True):
        np.testing.assert_array_equal(g, e)
    assert not AttentionSizesPass()(after).modified  # nothing left to rebuild


@pytest.mark.parametrize(
    ("batch", "last"),
    [(OFF_THE_PROJECTION, LAST), (OFF_THE_MASK, TOTAL)],
    ids=["a size read off the projection", "seqlens_k the total length"],
)
def test_sizes_from_elsewhere_or_not_the_contract_stay(batch: str, last: str) -> None:
    model = _model(batch, last)
    before = ir.serde.serialize_model(model).SerializeToString()
    assert not AttentionSizesPass()(model).modified
    assert ir.serde.serialize_model(model).SerializeToString() == before

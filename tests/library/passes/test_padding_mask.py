"""``passes/padding_mask.py``: the main graph's causal-and-padding mask, read only by fused causal
attention, becomes the padding mask alone, after probes show the two agree where causality lets
the kernel read; a mask that differs there, or one something else reads, stays.

A small step model as ONNX text: the main graph builds a 4-D mask from the 2-D attention mask as
transformers does (causal over the past's offset, and padding), and a layer function reads it as
the fused layers do (sizes through ``Shape``, the bias through ``Where`` into
``GroupQueryAttention``). ONNX Runtime runs the model before and after on a left-padded batch."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.library.passes.padding_mask import PaddingMaskPass, first_difference

#: {window}: an extra condition on the mask (a sliding window, say), "" for none.
MODEL = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (int64[batch, sequence_length] input_ids, int64[batch, total_sequence_length] attention_mask,
      float[batch, sequence_length, 16] x) => (float[batch, sequence_length, 16] y) {{
    new = Shape <start = 1, end = 2> (input_ids)
    total = Shape <start = 1, end = 2> (attention_mask)
    past = Sub (total, new)
    zero = Constant <value_int = 0> ()
    one = Constant <value_int = 1> ()
    new_n = Squeeze (new)
    total_n = Squeeze (total)
    past_n = Squeeze (past)
    steps = Range (zero, new_n, one)
    rows = Add (steps, past_n)
    cols = Range (zero, total_n, one)
    row_axis = Constant <value_ints = [1]> ()
    col_axis = Constant <value_ints = [0]> ()
    rows2 = Unsqueeze (rows, row_axis)
    cols2 = Unsqueeze (cols, col_axis)
    causal = LessOrEqual (cols2, rows2)
    {window}
    flags = Cast <to = 9> (attention_mask)
    pad_axes = Constant <value_ints = [1, 2]> ()
    padding = Unsqueeze (flags, pad_axes)
    mask = And (allowed, padding)
    y = hyperexport.fn.Layer (x, mask)
}}
<domain: "hyperexport.fn", opset_import: ["" : 18, "com.microsoft" : 1]>
Layer (x, mask) => (y) {{
    nothing = Constant <value_float = 0.0> ()
    lowest = Constant <value_float = -3.4e38> ()
    bias = Where (mask, nothing, lowest)
    batch = Shape <start = 0, end = 1> (mask)
    total = Shape <start = 3, end = 4> (mask)
    one = Constant <value_ints = [1]> ()
    last = Sub (total, one)
    last32 = Cast <to = 6> (last)
    seqlens = Expand (last32, batch)
    total32 = Cast <to = 6> (total)
    scalar = Squeeze (total32)
    y, present_key, present_value = com.microsoft.GroupQueryAttention <num_heads = 2, kv_num_heads = 2> (
        x, x, x, , , seqlens, scalar, , , , bias)
    {reader}
}}
"""
NO_WINDOW = "allowed = Identity (causal)"
#: Keys at most 1 position behind the query: a sliding window of 2.
WINDOW = """width = Constant <value_int = 2> ()
    oldest = Sub (rows2, width)
    recent = Greater (cols2, oldest)
    allowed = And (causal, recent)"""


def _model(window: str = NO_WINDOW, reader: str = "") -> ir.Model:
    text = MODEL.format(window=window, reader=reader)
    return ir.serde.deserialize_model(onnx.parser.parse_model(text))


def _run(model: ir.Model, pads: list[int], new: int = 5) -> np.ndarray:
    proto = ir.to_proto(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mask = (np.arange(new)[None, :] >= np.asarray(pads)[:, None]).astype(np.int64)
    x = np.random.default_rng(0).standard_normal((len(pads), new, 16), dtype=np.float32)
    [y] = session.run(
        None, {"input_ids": np.zeros(mask.shape, np.int64), "attention_mask": mask, "x": x}
    )
    return y


def _call_mask_producer(model: ir.Model) -> str:
    [call] = [n for n in model.graph if n.op_type == "Layer"]
    producer = call.inputs[1].producer()
    assert producer is not None
    return producer.name or ""


def test_the_causal_mask_becomes_the_padding_mask_and_the_outputs_stay() -> None:
    model = _model()
    expected = _run(model, [0, 2, 4])

    assert first_difference(model, model.graph.node(-1).inputs[1]) is None
    assert PaddingMaskPass()(model).modified
    RemoveUnusedNodesPass()(model)

    assert _call_mask_producer(model) == "padding_mask_expand"
    assert not {"Range", "LessOrEqual", "And"} & {n.op_type for n in model.graph}
    # the same numbers: the kernel never reads the bias past a query's own position
    np.testing.assert_array_equal(_run(model, [0, 2, 4]), expected)
    assert not PaddingMaskPass()(model).modified  # the padding mask is not replaced again


def test_a_sliding_window_is_kept_and_the_probe_that_shows_it_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _model(WINDOW)
    with caplog.at_level(logging.INFO, logger="hyperexport"):
        assert not PaddingMaskPass()(model).modified
    [kept] = [r.message for r in caplog.records if "kept the main graph's" in r.message]
    # the first probe longer than the window: of 4 new tokens, the third skips the first
    assert "with 4 new tokens of 4, left padding [0], row 0 token 2 skips position 0" in kept
    assert "padding_mask" not in _call_mask_producer(model)


def test_a_mask_something_else_reads_is_kept() -> None:
    # the layer also returns the mask cast to float: the causal part shows there
    text = MODEL.format(window=NO_WINDOW, reader="shown = Cast <to = 1> (mask)")
    text = text.replace("Layer (x, mask) => (y)", "Layer (x, mask) => (y, shown)")
    text = text.replace(
        "y = hyperexport.fn.Layer (x, mask)", "y, shown = hyperexport.fn.Layer (x, mask)"
    )
    text = text.replace(
        "=> (float[batch, sequence_length, 16] y)",
        "=> (float[batch, sequence_length, 16] y, float[batch, 1, sequence_length, total_sequence_length] shown)",
    )
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    assert not PaddingMaskPass()(model).modified
    assert "padding_mask" not in _call_mask_producer(model)

"""``passes/share_kv_buffer.py``: a generation step's pasts as onnxruntime-genai's shared buffers.

A small step written as ONNX text, as the fusion leaves it: a function whose
GroupQueryAttention takes its ``past_key``/``past_value`` inputs as the past and computes the
total length from the past's ``Shape``; the main graph feeds it ``past_key_values.0.*`` through a
single-input ``Concat`` (a TorchScript leftover) and reads the past length from the past's shape.
After the pass, the model run with pasts longer than their valid rows (filled with a large value)
must give what the original gives on the exact pasts: the valid length comes from the masks."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from hyperexport.base.errors import RewriteError
from hyperexport.library.check.kv_buffer import PADDED_ROWS, padded, valid_rows
from hyperexport.library.passes.share_kv_buffer import (
    META_KV_BUFFER,
    ShareKVBufferPass,
    shared_buffer_inputs,
)

STEP = """
<ir_version: 10, opset_import: ["" : 18, "com.microsoft" : 1, "hyperexport.fn" : 1]>
main (int64[B, S] input_ids, int64[B, T] attention_mask, float[B, S, 8] q, float[B, S, 8] k,
      float[B, S, 8] v, float[B, 1, S, T] bias,
      float[B, 1, P, 8] past_key_values_0_key, float[B, 1, P, 8] past_key_values_0_value)
   => (float[B, S, 8] out, float[B, 1, T, 8] present_0_key, float[B, 1, T, 8] present_0_value,
       int64[1] past_length) {
    pk = Concat <axis = 0> (past_key_values_0_key)
    shape = Shape (pk)
    two = Constant <value_ints = [2]> ()
    past_length = Gather <axis = 0> (shape, two)
    out, present_0_key, present_0_value = hyperexport.fn.Step (q, k, v, bias, pk,
        past_key_values_0_value)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "com.microsoft" : 1]>
Step (q, k, v, bias, past_key, past_value) => (o, present_key, present_value) {
    past_shape = Shape (past_key)
    new_shape = Shape (k)
    two = Constant <value_ints = [2]> ()
    one = Constant <value_ints = [1]> ()
    zero = Constant <value_ints = [0]> ()
    past = Gather <axis = 0> (past_shape, two)
    new = Gather <axis = 0> (new_shape, one)
    total = Add (past, new)
    last = Sub (total, one)
    batch = Gather <axis = 0> (new_shape, zero)
    rows = Expand (last, batch)
    seqlens = Cast <to = 6> (rows)
    total32 = Cast <to = 6> (total)
    o, present_key, present_value = com.microsoft.GroupQueryAttention <num_heads = 1,
        kv_num_heads = 1> (q, k, v, past_key, past_value, seqlens, total32, , , , bias)
}
"""


def _model() -> ir.Model:
    # The text format takes no dots in names: onnxruntime-genai's are put back here.
    model = ir.serde.deserialize_model(onnx.parser.parse_model(STEP))
    for value in [*model.graph.inputs, *model.graph.outputs]:
        assert value.name is not None
        value.name = value.name.replace("past_key_values_0_", "past_key_values.0.").replace(
            "present_0_", "present.0."
        )
    return model


def _session(model: ir.Model) -> ort.InferenceSession:
    return ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString())


def _feeds(batch: int = 2, past: int = 5, new: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    total = past + new
    mask = np.ones((batch, total), np.int64)
    return {
        "input_ids": np.zeros((batch, new), np.int64),
        "attention_mask": mask,
        "q": rng.standard_normal((batch, new, 8)).astype(np.float32),
        "k": rng.standard_normal((batch, new, 8)).astype(np.float32),
        "v": rng.standard_normal((batch, new, 8)).astype(np.float32),
        "bias": np.zeros((batch, 1, new, total), np.float32),
        "past_key_values.0.key": rng.standard_normal((batch, 1, past, 8)).astype(np.float32),
        "past_key_values.0.value": rng.standard_normal((batch, 1, past, 8)).astype(np.float32),
    }


def test_the_pasts_become_buffers_read_only_on_their_valid_rows() -> None:
    original = _model()
    shared = _model()
    assert ShareKVBufferPass()(shared).modified
    assert shared.metadata_props[META_KV_BUFFER] == "shared"
    # The main graph's pasts (positions 6 and 7) and the function's (4 and 5).
    assert shared_buffer_inputs(shared) == {"": (6, 7), "Step": (4, 5)}
    assert shared_buffer_inputs(original) == {}
    assert not any(n.op_type == "Concat" and len(n.inputs) == 1 for n in shared.graph)
    feeds = _feeds()
    expected = _session(original).run(None, feeds)
    names = list(feeds)
    buffers = [names.index("past_key_values.0.key"), names.index("past_key_values.0.value")]
    fed = dict(zip(names, padded(list(feeds.values()), buffers), strict=True))
    assert fed["past_key_values.0.key"].shape[2] == 5 + PADDED_ROWS
    actual = _session(shared).run(None, fed)
    assert actual[1].shape[2] == 5 + PADDED_ROWS  # max(total, buffer): the buffer's length
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(valid_rows(a, e), e)
    # The exact pasts are buffers too: the same results, the presents as long as the total.
    for a, e in zip(_session(shared).run(None, feeds), expected, strict=True):
        np.testing.assert_array_equal(a, e)


def test_a_second_run_changes_nothing() -> None:
    model = _model()
    ShareKVBufferPass()(model)
    before = ir.serde.serialize_model(model).SerializeToString()
    assert not ShareKVBufferPass()(model).modified
    assert ir.serde.serialize_model(model).SerializeToString() == before


def test_a_model_without_generation_inputs_is_left_alone() -> None:
    model = _model()
    model.graph.inputs[0].name = "tokens"  # no input_ids: not onnxruntime-genai's step
    assert not ShareKVBufferPass()(model).modified
    assert META_KV_BUFFER not in model.metadata_props


def test_a_past_read_otherwise_than_by_its_shape_is_refused() -> None:
    model = _model()
    [function] = model.functions.values()
    past = function.inputs[4]
    node = ir.Node("", "ReduceSum", [past], name="reads_rows")
    function.append(node)
    function.outputs.append(node.outputs[0])
    with pytest.raises(RewriteError, match="also read by \\['ReduceSum'\\]"):
        ShareKVBufferPass()(model)


def test_the_main_graph_reading_a_past_gets_its_valid_rows() -> None:
    def with_sum(model: ir.Model) -> ir.Model:
        past = next(v for v in model.graph.inputs if v.name == "past_key_values.0.value")
        node = ir.Node("", "ReduceSum", [past], [ir.AttrInt64("keepdims", 0)], name="sums")
        model.graph.append(node)
        node.outputs[0].name = "sum"
        model.graph.outputs.append(node.outputs[0])
        return model

    original, shared = with_sum(_model()), with_sum(_model())
    assert ShareKVBufferPass()(shared).modified
    assert any(n.op_type == "Slice" for n in shared.graph)
    feeds = _feeds()
    names = list(feeds)
    fed = dict(zip(names, padded(list(feeds.values()), [6, 7]), strict=True))
    expected = _session(original).run(None, feeds)
    actual = _session(shared).run(None, fed)
    np.testing.assert_allclose(actual[-1], expected[-1], rtol=1e-6)

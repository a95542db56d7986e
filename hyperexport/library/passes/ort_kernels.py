"""What the installed ONNX Runtime's contrib kernels accept: asked, not assumed.

A fusion may write only what the ONNX Runtime that will run the model loads. Where a kernel's
inputs grew between releases, a one-node model with the input is loaded once per process; a
refusal is the answer (the rewrite stage's key covers the onnxruntime version).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import numpy as np
import onnx

log = logging.getLogger(__name__)

MS_DOMAIN = "com.microsoft"

#: GroupQueryAttention's inputs, in order, up to ``query_seqlens`` (the number of valid rows of
#: each batch entry's query chunk: batched multi-token steps over a past need it on the CPU).
GQA_INPUTS = (
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale",
    "v_scale", "q_norm_weight", "k_norm_weight", "query_seqlens",
)  # fmt: skip


def _refusals() -> tuple[type[Exception], ...]:
    """The exceptions ONNX Runtime raises for a model it does not load or run."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return tuple(
        obj
        for obj in vars(ort_state).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    )


def _gqa_probe(used: Mapping[str, tuple[int, list[int]]], do_rotary: int = 0) -> onnx.ModelProto:
    """A one-node GroupQueryAttention model with the ``used`` inputs (name -> type, shape)."""
    tensor = onnx.helper.make_tensor_value_info
    names = [n if n in used else "" for n in GQA_INPUTS]
    while names and not names[-1]:
        names.pop()
    node = onnx.helper.make_node(
        "GroupQueryAttention",
        names,
        ["output", "present_key", "present_value"],
        domain=MS_DOMAIN,
        num_heads=1,
        kv_num_heads=1,
        do_rotary=do_rotary,
    )
    inputs = [tensor(n, *used[n]) for n in GQA_INPUTS if n in used]
    outputs = [tensor(n, onnx.TensorProto.FLOAT, None) for n in node.output]
    graph = onnx.helper.make_graph([node], "probe", inputs, outputs)
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(MS_DOMAIN, 1)]
    return onnx.helper.make_model(graph, opset_imports=opsets)


@functools.cache
def gqa_takes_query_seqlens() -> bool:
    """Whether ONNX Runtime's GroupQueryAttention loads with ``query_seqlens`` (ONNX Runtime
    without it runs a step of several tokens over a past with batch 1 only)."""
    import onnxruntime as ort

    f32, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    used = {n: (f32, [1, 2, 8]) for n in ("query", "key", "value")}
    used |= {n: (f32, [1, 1, 1, 8]) for n in ("past_key", "past_value")}
    used |= {"seqlens_k": (i32, [1]), "total_sequence_length": (i32, [])}
    used |= {"query_seqlens": (i32, [1])}
    model = _gqa_probe(used)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except _refusals() as e:
        log.info("ONNX Runtime's GroupQueryAttention takes no query_seqlens: %s", e)
        return False
    return True


@functools.cache
def gqa_rotates_by_position_ids() -> bool:
    """Whether ONNX Runtime's GroupQueryAttention, given ``query_seqlens``, rotates a first
    prompt's keys (``do_rotary``) by the table rows ``position_ids`` names, not by each token's
    index: run once on a two-token prompt at positions 2 and 3."""
    if not gqa_takes_query_seqlens():
        return False
    import onnxruntime as ort

    f32, i32, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32, onnx.TensorProto.INT64
    head, rows = 16, 4
    used = {n: (f32, [1, 2, head]) for n in ("query", "key", "value")}
    used |= {n: (f32, [1, 1, rows, head]) for n in ("past_key", "past_value")}
    used |= {"seqlens_k": (i32, [1]), "total_sequence_length": (i32, [])}
    used |= {n: (f32, [rows, head // 2]) for n in ("cos_cache", "sin_cache")}
    used |= {"position_ids": (i64, [1, 2]), "query_seqlens": (i32, [1])}
    angles = np.arange(rows, dtype=np.float32)[:, None] * 0.5 ** np.arange(
        1, head // 2 + 1, dtype=np.float32
    )
    key = np.arange(1, 2 * head + 1, dtype=np.float32).reshape(1, 2, head) / head
    feed = {
        "query": key, "key": key, "value": key,
        "past_key": np.zeros((1, 1, rows, head), np.float32),
        "past_value": np.zeros((1, 1, rows, head), np.float32),
        "seqlens_k": np.asarray([1], np.int32), "total_sequence_length": np.asarray(2, np.int32),
        "cos_cache": np.cos(angles), "sin_cache": np.sin(angles),
        "position_ids": np.asarray([[2, 3]], np.int64), "query_seqlens": np.asarray([2], np.int32),
    }  # fmt: skip
    try:
        session = ort.InferenceSession(
            _gqa_probe(used, do_rotary=1).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        present = session.run(["present_key"], feed)[0][0, 0, :2]
    except _refusals() as e:
        log.info("ONNX Runtime's GroupQueryAttention does not rotate by position_ids: %s", e)
        return False
    first, second = key[0, :, : head // 2], key[0, :, head // 2 :]
    cos, sin = np.cos(angles[2:4]), np.sin(angles[2:4])
    expected = np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
    return bool(np.allclose(present, expected, atol=1e-5))

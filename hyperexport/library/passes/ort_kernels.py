"""What the installed ONNX Runtime's contrib kernels accept: asked, not assumed.

A fusion may write only what the ONNX Runtime that will run the model loads. Where a kernel's
inputs grew between releases, a one-node model with the input is loaded once per process; a
refusal is the answer (the rewrite stage's key covers the onnxruntime version).
"""

from __future__ import annotations

import functools
import logging

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


@functools.cache
def gqa_takes_query_seqlens() -> bool:
    """Whether ONNX Runtime's GroupQueryAttention loads with ``query_seqlens`` (ONNX Runtime
    without it runs a step of several tokens over a past with batch 1 only)."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    refusals = tuple(
        obj
        for obj in vars(ort_state).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    )

    tensor = onnx.helper.make_tensor_value_info
    f32, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    used = {"query", "key", "value", "past_key", "past_value", "seqlens_k"}
    used |= {"total_sequence_length", "query_seqlens"}
    names = [n if n in used else "" for n in GQA_INPUTS]
    node = onnx.helper.make_node(
        "GroupQueryAttention",
        names,
        ["output", "present_key", "present_value"],
        domain=MS_DOMAIN,
        num_heads=1,
        kv_num_heads=1,
    )
    inputs = [
        *(tensor(n, f32, [1, 2, 8]) for n in ("query", "key", "value")),
        *(tensor(n, f32, [1, 1, 1, 8]) for n in ("past_key", "past_value")),
        tensor("seqlens_k", i32, [1]),
        tensor("total_sequence_length", i32, []),
        tensor("query_seqlens", i32, [1]),
    ]
    outputs = [tensor(n, f32, None) for n in node.output]
    graph = onnx.helper.make_graph([node], "probe", inputs, outputs)
    opsets = [onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(MS_DOMAIN, 1)]
    model = onnx.helper.make_model(graph, opset_imports=opsets)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except refusals as e:
        log.info("ONNX Runtime's GroupQueryAttention takes no query_seqlens: %s", e)
        return False
    return True

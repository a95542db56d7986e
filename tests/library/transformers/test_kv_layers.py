"""Decoder-layer functions with explicit past/present KV: prefill and decode in ORT match torch."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from hyperexport import ExportOptions, export_hyper_onnx, zoo
from hyperexport.transformers.kv_layers import KVCacheLayer, KVStep, explicit_kv_layers
from hyperexport.transformers.static_cache import ExplicitKVCacheModel
from tests.helpers.release_skips import NEEDS_DECODING_TASKS


def _step(batch: int, past: int, new: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (batch, new), generator=g)
    mask = torch.ones(batch, past + new, dtype=torch.int64)
    positions = torch.arange(past, past + new).unsqueeze(0).expand(batch, -1)
    pasts = [torch.randn(batch, 2, past, 16, generator=g) for _ in range(4)]
    return (ids, mask, positions, *pasts)


@NEEDS_DECODING_TASKS  # the KV layers
@pytest.mark.parametrize(
    ("mode", "dynamo"),
    [("per_type", False), ("per_instance", False), ("per_type", True)],
    ids=["per_type-torchscript", "per_instance-torchscript", "per_type-dynamo"],
)
def test_layer_functions_serve_prefill_and_decode(mode: str, dynamo: bool) -> None:
    model = zoo.tiny_llama(num_layers=2)
    wrapper = ExplicitKVCacheModel(model).eval()
    inputs, outputs = wrapper.io_names()
    axes = wrapper.dynamic_axes()  # names outputs too, as torch.onnx.export allows
    # The second shape must keep total_len = past_len + new_len, so it is given explicitly.
    probe = tuple((n, tuple(t.shape)) for n, t in zip(inputs, _step(3, 5, 1, 1)))
    # torch.export specialises a traced size of 1, so the dynamo path traces batch 2; the
    # mask's total_len = past_len + new_len is related, not independent (Dim.AUTO finds it).
    example = _step(2, 3, 4, 0) if dynamo else _step(1, 3, 4, 0)
    buffer = io.BytesIO()
    with explicit_kv_layers(model):
        export_hyper_onnx(
            wrapper,
            example,
            buffer,
            hiera=[KVStep],
            dynamo=dynamo,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            options=ExportOptions(functions=mode, probe_shapes=probe),  # type: ignore[arg-type]
        )
    assert all(isinstance(layer, type(model.layers[0])) for layer in model.layers)  # restored
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    names = sorted(f.name for f in proto.functions)
    if mode == "per_type":
        assert names == ["KVStep"]
        function = proto.functions[0]
        assert list(function.input)[:6] == [
            "hidden_states",
            "attention_mask",
            "cos",
            "sin",
            "past_key",
            "past_value",
        ]
        assert len(function.output) == 3  # hidden states, present key, present value
    else:
        assert names == ["KVStep_model_layers_0_step", "KVStep_model_layers_1_step"]
    session = ort.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    prefill = _step(1, 0, 5, 2)
    got = session.run(None, dict(zip(inputs, [t.numpy() for t in prefill])))
    with torch.no_grad():
        want = wrapper(*prefill)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-4)
    decode = (
        torch.randint(0, 128, (1, 1)),
        torch.ones(1, 6, dtype=torch.int64),
        torch.tensor([[5]]),
        *[torch.from_numpy(p) for p in got[1:]],
    )
    got = session.run(None, dict(zip(inputs, [t.numpy() for t in decode])))
    with torch.no_grad():
        want = wrapper(*decode)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-4)


def test_swap_is_undone_when_the_export_raises() -> None:
    model = zoo.tiny_llama(num_layers=2)
    originals = list(model.layers)
    with pytest.raises(RuntimeError), explicit_kv_layers(model) as wrapped:
        assert all(isinstance(layer, KVCacheLayer) for layer in model.layers)
        assert len(wrapped) == 2
        raise RuntimeError("boom")
    assert list(model.layers) == originals


@NEEDS_DECODING_TASKS  # the KV layers
def test_a_layer_that_returns_a_tuple_still_gets_one() -> None:
    """transformers 4.57's Gemma2 layers return ``(hidden,)`` and its stack takes ``[0]`` (5.x's
    return the tensor): the step model must decode the same with the layers swapped, across the
    sliding-window and full-attention layers, on a past longer than the window."""
    from hyperexport.library.tasks.steps import CausalLMStep

    config = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "max_position_embeddings": 128,
    }
    model = zoo.random_transformer("Gemma2ForCausalLM", config, attn_implementation="eager")
    step = CausalLMStep(model).eval()
    batch, past, new = 2, 12, 4
    g = torch.Generator().manual_seed(0)
    pasts = {
        str(i): {k: torch.randn(batch, 2, past, 16, generator=g) for k in ("key", "value")}
        for i in range(2)
    }
    args = (
        torch.randint(3, 128, (batch, new), generator=g),
        torch.ones(batch, past + new, dtype=torch.int64),
        torch.arange(past, past + new).expand(batch, -1),
    )
    with torch.no_grad():
        want = step(*args, pasts)
        with explicit_kv_layers(model):
            got = step(*args, pasts)
    torch.testing.assert_close(got["logits"], want["logits"])
    for i in ("0", "1"):
        assert got["present"][i]["key"].shape[2] == past + new
        torch.testing.assert_close(got["present"][i]["key"], want["present"][i]["key"])

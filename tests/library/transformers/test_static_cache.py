"""Explicit KV-cache export of tiny Llama: prefill and one decode step in ORT match torch."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import onnx_ir as ir
import pytest
import torch

from hyperexport import zoo
from hyperexport.base import versions
from hyperexport.base.versions import cache_keyword
from hyperexport.library.passes.promote_attention import PromoteAttentionToOpset24Pass
from hyperexport.library.transformers.attention import attention_export_context
from hyperexport.library.transformers.patches import export_patches
from hyperexport.transformers.static_cache import ExplicitKVCacheModel, StaticCache
from tests.helpers.ort import run_ort
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_HYPEREXPORT_ATTENTION,
    NEEDS_MASKING_UTILS,
    torchscript_export_arguments,
    torchscript_repairs,
)

pytest.importorskip("transformers")

BATCH = 2


def _export(wrapper, base, path, dynamo: bool, promote: bool) -> None:
    g = torch.Generator().manual_seed(0)
    past = [torch.randn(BATCH, 2, 3, 16, generator=g) for _ in range(2 * wrapper.num_layers)]
    ids = torch.randint(0, 128, (BATCH, 2), generator=g)
    mask = torch.ones(BATCH, 5, dtype=torch.int64)
    positions = torch.arange(3, 5).expand(BATCH, 2)
    inputs, outputs = wrapper.io_names()
    with ExitStack() as stack:
        stack.enter_context(export_patches(dynamo))
        table = {}
        if promote:
            table = stack.enter_context(attention_export_context(dynamo=dynamo, model=base))
        if dynamo:
            batch, past_len = torch.export.Dim("batch"), torch.export.Dim("past_len")
            new_len, total_len = torch.export.Dim("new_len"), torch.export.Dim("total_len")
            shapes = (
                {0: batch, 1: new_len},
                {0: batch, 1: total_len},
                {0: batch, 1: new_len},
                tuple({0: batch, 2: past_len} for _ in past),
            )
            kwargs = {
                "dynamo": True,
                "opset_version": 18,
                "dynamic_shapes": shapes,
                "custom_translation_table": table,
            }
        else:
            kwargs = {**torchscript_export_arguments(), "dynamic_axes": wrapper.dynamic_axes()}
            stack.enter_context(torchscript_repairs())
        torch.onnx.export(
            wrapper,
            (ids, mask, positions, *past),
            path,
            input_names=inputs,
            output_names=outputs,
            **kwargs,
        )
    if promote:
        model = ir.load(path)
        assert PromoteAttentionToOpset24Pass()(model).modified
        assert sum(n.op_type == "Attention" for n in model.graph.all_nodes()) == 2
        ir.save(model, path)


@pytest.mark.parametrize(
    ("dynamo", "promote"),
    [
        (False, False),
        pytest.param(False, True, marks=NEEDS_HYPEREXPORT_ATTENTION),
        pytest.param(
            True,
            True,
            marks=pytest.mark.xfail(
                versions.export_refuses_one_token_guards(),
                reason=f"torch.export (torch {versions.torch_version()}, "
                "versions.EXPORT_REFUSES_ONE_TOKEN_GUARDS) guards new_len != 1 and refuses the "
                "dynamic length: Constraints violated (new_len); this is torch's own export",
                strict=True,
            ),
        ),
    ],
)
@NEEDS_DECODING_TASKS  # ExplicitKVCacheModel makes DynamicCache(config=...), as the KV layers do
def test_prefill_then_decode_matches_torch(dynamo, promote, tmp_path, ort_run, diff):
    base = zoo.tiny_llama(num_layers=2, causal_lm=True)
    wrapper = ExplicitKVCacheModel(base).eval()
    path = tmp_path / "kv.onnx"
    _export(wrapper, base, path, dynamo, promote)
    inputs, _ = wrapper.io_names()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 128, (BATCH, 5), generator=g)
    step = torch.randint(0, 128, (BATCH, 1), generator=g)

    prefill_args = [
        prompt,
        torch.ones(BATCH, 5, dtype=torch.int64),
        torch.arange(5).expand(BATCH, 5),
    ]
    prefill_args += wrapper.empty_past(BATCH)
    with torch.no_grad():
        torch_prefill = wrapper(*prefill_args)
    ort_prefill = ort_run(path, {n: t.numpy() for n, t in zip(inputs, prefill_args)})
    for got, expected in zip(ort_prefill, torch_prefill):
        assert diff(got, expected.numpy()) <= 1e-4

    decode_args = [step, torch.ones(BATCH, 6, dtype=torch.int64), torch.full((BATCH, 1), 5)]
    with torch.no_grad():
        torch_decode = wrapper(*decode_args, *torch_prefill[1:])
        full = base(input_ids=torch.cat([prompt, step], dim=1)).logits[:, -1:]
    feeds = {n: t.numpy() for n, t in zip(inputs, decode_args)}
    feeds.update(zip(inputs[3:], ort_prefill[1:]))
    ort_decode = ort_run(path, feeds)
    for got, expected in zip(ort_decode, torch_decode):
        assert diff(got, expected.numpy()) <= 1e-4
    assert ort_decode[1].shape == (BATCH, 2, 6, 16)
    assert diff(ort_decode[0], full.numpy()) <= 1e-4
    assert isinstance(ort_decode[0], np.ndarray)


# --- StaticCache: a fixed-size, scatter-updated cache that is a tensor -------------------------

HEAD_DIM, MAX_LEN = 16, 12


def _static_cache(layers: int = 2, batch: int = 1, heads: int = 2) -> StaticCache:
    return (
        torch.zeros(layers)
        .as_subclass(StaticCache)
        .early_initialization(batch, heads, HEAD_DIM, max_cache_len=MAX_LEN)
    )


def test_static_cache_updates_at_the_given_positions_and_reports_its_length() -> None:
    cache = _static_cache()
    keys = torch.randn(1, 2, 3, HEAD_DIM)
    values = torch.randn(1, 2, 3, HEAD_DIM)
    got_k, got_v = cache.update(keys, values, 1, kwargs={"position_ids": torch.tensor([[4, 5, 6]])})
    assert got_k.shape == (1, 2, MAX_LEN, HEAD_DIM)  # the whole fixed-size layer
    torch.testing.assert_close(got_k[:, :, 4:7], keys)
    torch.testing.assert_close(got_v[:, :, 4:7], values)
    torch.testing.assert_close(cache[1, 1][:, :, 4:7], values)  # written in place, eagerly
    assert cache.get_seq_length(1) == 3 and cache.get_seq_length(0) == 0
    assert int(cache.get_query_offset(1)) == 3
    assert cache.get_mask_sizes(3, 0) == (MAX_LEN, 0)
    assert cache.get_max_cache_shape(0) == MAX_LEN and cache.get_max_cache_shape(2) == -1
    # Without positions, new states follow what is written (cache_position wins over all).
    cache.update(keys[:, :, :1], values[:, :, :1], 0)
    cache.update(keys[:, :, 1:2], values[:, :, 1:2], 0)
    torch.testing.assert_close(cache[0, 0][:, :, :2], keys[:, :, :2])
    cache.update(keys, values, 0, {"cache_position": torch.tensor([9, 10, 11])})
    torch.testing.assert_close(cache[0, 0][:, :, 9:], keys)


def test_static_cache_reorders_beams_and_resets() -> None:
    cache = _static_cache(batch=2)
    cache.update(torch.ones(2, 2, 1, HEAD_DIM).cumsum(0), torch.ones(2, 2, 1, HEAD_DIM), 0)
    cache.reorder_cache(torch.tensor([1, 0]))
    assert float(cache[0, 0, 0, 0, 0, 0]) == 2.0 and float(cache[0, 0, 1, 0, 0, 0]) == 1.0
    cache.reset()
    assert cache.get_seq_length() == 0 and not cache.any()


def _llama_step(model: torch.nn.Module, cache: StaticCache, ids: torch.Tensor, start: int) -> dict:
    new = ids.shape[1]
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(1, start + new, dtype=torch.int64),
        "position_ids": torch.arange(start, start + new)[None],
        cache_keyword(): cache,  # past_key_values in transformers 4.57
        "use_cache": True,
    }


# Before masking_utils (4.53), a model sizes its mask by the attention mask unless the cache is
# transformers' own StaticCache; masking_utils asks the cache (get_mask_sizes), as this one answers.
@NEEDS_MASKING_UTILS
@NEEDS_DECODING_TASKS  # 4.53.3's layers refuse a cache that is not transformers' Cache
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_decoder_layer_functions_with_a_static_cache_match_torch(dynamo: bool) -> None:
    """hiera=[LlamaAttention, LlamaDecoderLayer] on a model run with a cache object: the cache
    crosses every function boundary as a tensor; prefill and a later step match torch in ORT."""
    import io

    import onnx
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer

    from hyperexport import export_hyper_onnx

    model = zoo.tiny_llama(num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=2)
    g = torch.Generator().manual_seed(0)
    prompt, step = (
        torch.randint(0, 128, (1, 3), generator=g),
        torch.randint(0, 128, (1, 2), generator=g),
    )
    # Export a step that continues a 3-token context (the cache holds it, positions 3 and 4).
    context = _static_cache()
    with torch.no_grad():
        model(**_llama_step(model, context, prompt, 0))
    example = _llama_step(model, context.clone(), step, 3)
    with torch.no_grad():
        want = model(**_llama_step(model, context.clone(), step, 3)).last_hidden_state
    buffer = io.BytesIO()
    export_hyper_onnx(
        model,
        (example,),  # a trailing dict: keyword inputs
        buffer,
        hiera=[LlamaAttention, LlamaDecoderLayer],
        dynamo=dynamo,
        input_names=["input_ids", "attention_mask", "position_ids", "cache"],
        output_names=["last_hidden_state"],
    )
    proto = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(proto, full_check=True)
    classes = {f.name.split("_")[0] for f in proto.functions}
    assert {"LlamaAttention", "LlamaDecoderLayer"} <= classes
    assert [i.name for i in proto.graph.input] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "cache",
    ]
    feeds = {
        "input_ids": step.numpy(),
        "attention_mask": example["attention_mask"].numpy(),
        "position_ids": example["position_ids"].numpy(),
        "cache": context.as_subclass(torch.Tensor).numpy(),
    }
    got = run_ort(buffer.getvalue(), feeds)[0]
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4)

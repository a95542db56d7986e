"""Explicit KV-cache export of tiny Llama: prefill and one decode step in ORT match torch."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import onnx_ir as ir
import pytest
import torch

from hyperexport import zoo
from hyperexport.passes.promote_attention import PromoteAttentionToOpset24Pass
from hyperexport.transformers.attention import attention_export_context
from hyperexport.transformers.patches import export_patches
from hyperexport.transformers.static_cache import ExplicitKVCacheModel

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
            kwargs = {"dynamic_shapes": shapes, "custom_translation_table": table}
        else:
            kwargs = {"dynamic_axes": wrapper.dynamic_axes()}
        torch.onnx.export(
            wrapper,
            (ids, mask, positions, *past),
            path,
            dynamo=dynamo,
            opset_version=18,
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
    [(False, False), (False, True), (True, True)],
)
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

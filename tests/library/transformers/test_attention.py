"""The attention custom op, its ONNX lowering on both paths, and the transformers entry."""

from __future__ import annotations

import subprocess
import sys

import onnx
import onnx_ir as ir
import pytest
import torch
import torch.nn.functional as F

from hyperexport import zoo
from hyperexport.base.errors import HyperExportError
from hyperexport.library.passes.promote_attention import PromoteAttentionToOpset24Pass
from hyperexport.library.transformers.attention import (
    attention_export_context,
    registered_attention,
)
from hyperexport.library.transformers.attention_onnx import ATTENTION_DOMAIN
from hyperexport.library.transformers.attention_op import attention, attention_reference
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION

pytest.importorskip("transformers")


def _sdpa(q, k, v, **kwargs):
    """torch's SDPA with key/value heads repeated to the query's (what ``enable_gqa=True`` does;
    the keyword came with torch 2.5, so the reference holds on every torch)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _qkv(q_heads: int, kv_heads: int, q_len: int = 5, kv_len: int = 7, dim: int = 8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, q_heads, q_len, dim, generator=g)
    k = torch.randn(2, kv_heads, kv_len, dim, generator=g)
    v = torch.randn(2, kv_heads, kv_len, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_op_matches_sdpa(q_heads, kv_heads, mask_kind):
    q, k, v = _qkv(q_heads, kv_heads, kv_len=5 if mask_kind == "causal" else 7)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
        mask[..., 0] = True
    elif mask_kind == "float":
        mask = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(1))
    causal = mask_kind == "causal"
    got = attention(q, k, v, mask, is_causal=causal, scale=0.2)
    expected = _sdpa(q, k, v, attn_mask=mask, is_causal=causal, scale=0.2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_default_scale_and_fully_masked_rows_match_sdpa():
    q, k, v = _qkv(4, 2)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[:, :, 0] = False
    expected = _sdpa(q, k, v, attn_mask=mask)
    if torch.isnan(expected[:, :, 0]).all():  # NaN for a fully masked row (torch 2.2.2)
        expected[:, :, 0] = 0
    torch.testing.assert_close(attention(q, k, v, mask), expected, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(attention(q, k, v, mask)[:, :, 0]) == 0


def test_three_d_inputs_match_four_d():
    q, k, v = _qkv(4, 2)

    def flat(x):
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)

    got = attention(flat(q), flat(k), flat(v), q_num_heads=4, kv_num_heads=2)
    torch.testing.assert_close(got, flat(attention(q, k, v)))


def test_softcap_caps_scaled_scores():
    q, k, v = _qkv(4, 4)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    expected = torch.softmax(3.0 * torch.tanh(scores / 3.0), dim=-1) @ v
    torch.testing.assert_close(attention(q, k, v, scale=0.5, softcap=3.0), expected)
    torch.testing.assert_close(attention_reference(q, k, v, scale=0.5, softcap=3.0), expected)


@NEEDS_HYPEREXPORT_ATTENTION
def test_import_registers_nothing():
    code = (
        "import hyperexport.library.transformers.attention, torch\n"
        "from transformers import AttentionInterface\n"
        "assert 'hyperexport' not in AttentionInterface._global_mapping\n"
        "assert not hasattr(torch.ops.hyperexport, 'attention')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@NEEDS_HYPEREXPORT_ATTENTION
def test_registration_is_reentrant_and_restored():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    with registered_attention("hyperexport"), registered_attention("hyperexport"):
        assert "hyperexport" in AttentionInterface._global_mapping
    assert "hyperexport" not in AttentionInterface._global_mapping
    assert "hyperexport" not in AttentionMaskInterface._global_mapping
    with pytest.raises(HyperExportError, match="built-in"), registered_attention("sdpa"):
        pass


@NEEDS_HYPEREXPORT_ATTENTION
def test_model_implementation_is_switched_and_restored():
    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
    with attention_export_context("hyperexport", dynamo=True, model=model):
        assert model.config._attn_implementation == "hyperexport"
        with torch.no_grad():
            got = model(input_ids=ids).last_hidden_state
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


class _Op(torch.nn.Module):
    def forward(self, q, k, v, m):
        return attention(q, k, v, m, scale=0.3)


@NEEDS_HYPEREXPORT_ATTENTION
@pytest.mark.parametrize("dynamo", [False, True])
def test_both_paths_emit_the_same_custom_node(dynamo, tmp_path):
    q, k, v = _qkv(4, 2)
    m = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    path = tmp_path / "op.onnx"
    with attention_export_context(dynamo=dynamo) as table:
        kwargs = {"custom_translation_table": table} if dynamo else {}
        torch.onnx.export(
            _Op().eval(), (q, k, v, m), path, dynamo=dynamo, opset_version=18, **kwargs
        )
    model = ir.load(path)
    [node] = [n for n in model.graph if n.op_type == "Attention"]
    assert node.domain == ATTENTION_DOMAIN
    assert len(node.inputs) == 4
    assert {n: a.value for n, a in node.attributes.items()} == pytest.approx(
        {"is_causal": 0, "scale": 0.3}
    )


@NEEDS_HYPEREXPORT_ATTENTION
def test_torchscript_symbolic_is_unregistered_on_exit(tmp_path):
    q, k, v = _qkv(4, 2)
    m = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    with attention_export_context(dynamo=False):
        pass
    # torch keeps an empty registry entry after unregistering: the error is a ValueError then.
    errors = (ValueError, torch.onnx.errors.UnsupportedOperatorError)
    with pytest.raises(errors):
        torch.onnx.export(
            _Op().eval(), (q, k, v, m), tmp_path / "x.onnx", dynamo=False, opset_version=18
        )


@NEEDS_HYPEREXPORT_ATTENTION
@pytest.mark.parametrize("dynamo", [False, True])
def test_tiny_llama_gqa_exports_one_promoted_attention_per_layer(
    dynamo, tmp_path, last_hidden, ort_run, diff
):
    """The issue's acceptance, on a flat export: 4 layers, GQA 4:2, opset 24, parity."""
    from hyperexport.library.transformers.patches import export_patches

    model = zoo.tiny_llama(num_layers=4, num_heads=4, num_kv_heads=2)
    wrapper = last_hidden(model).eval()
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = wrapper(ids).numpy()
    path = tmp_path / "llama.onnx"
    with (
        export_patches(dynamo),
        attention_export_context("hyperexport", dynamo=dynamo, model=model) as table,
    ):
        kwargs = {"custom_translation_table": table} if dynamo else {}
        torch.onnx.export(
            wrapper, (ids,), path, dynamo=dynamo, opset_version=18, input_names=["x"], **kwargs
        )
    onnx_model = ir.load(path)
    assert PromoteAttentionToOpset24Pass()(onnx_model).modified
    nodes = [n for n in onnx_model.graph.all_nodes() if n.op_type == "Attention"]
    assert len(nodes) == 4
    head_dim = 64 // 4
    for node in nodes:
        assert node.domain == ""
        assert node.attributes["scale"].value == pytest.approx(head_dim**-0.5)
        assert "q_num_heads" not in node.attributes
    assert onnx_model.opset_imports[""] == 24
    assert ATTENTION_DOMAIN not in onnx_model.opset_imports
    promoted = tmp_path / "promoted.onnx"
    ir.save(onnx_model, promoted)
    onnx.checker.check_model(str(promoted), full_check=True)
    assert diff(ort_run(promoted, {"x": ids.numpy()})[0], expected) <= 1e-4


class _Module(torch.nn.Module):
    def __init__(self, **attributes: bool) -> None:
        super().__init__()
        for name, value in attributes.items():
            setattr(self, name, value)


@pytest.mark.parametrize(
    ("attributes", "call_is_causal", "hinted"),
    [
        # transformers 4.x's GPT-2: is_causal=False whenever a mask is given; the module knows.
        ({"is_causal": True, "is_cross_attention": False}, False, True),
        # 4.x's GPT-2 cross-attention says is_causal=True too: is_cross_attention decides.
        ({"is_causal": True, "is_cross_attention": True}, False, False),
        ({"is_causal": False}, None, False),  # an encoder
        ({}, None, False),  # unknown is not causal
        ({}, True, False),  # the kernel gets is_causal itself: no hint needed
    ],
)
def test_causal_hint_follows_the_module_not_the_masked_call(
    attributes, call_is_causal, hinted, monkeypatch
):
    q, k, v = _qkv(4, 2, q_len=5, kv_len=5)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    seen: dict[str, object] = {}

    def recording_attention(*args, **kwargs):
        seen.update(kwargs)
        return attention(*args, **kwargs)

    from hyperexport.library.transformers import attention as entry

    monkeypatch.setattr(entry, "attention", recording_attention)
    calls = entry.attention_calls()
    entry.hyperexport_attention_forward(
        _Module(**attributes), q, k, v, mask if call_is_causal is not True else None,
        is_causal=call_is_causal,
    )  # fmt: skip
    assert seen["causal_hint"] is hinted
    assert entry.attention_calls() == calls + 1


def test_a_mask_a_key_longer_is_cut_to_the_keys_as_transformers_does():
    """Before masking_utils, a 4.x model given no attention mask builds one a key longer than
    the keys (GPT-2 on 4.53: past + length + 1); transformers' own attention functions cut it
    to the keys, and so does hyperexport's, else the scores and the mask do not add up."""
    from hyperexport.library.transformers import attention as entry

    q, k, v = _qkv(4, 2, q_len=5, kv_len=5)
    fitting = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    longer = torch.cat([fitting, torch.zeros(2, 1, 5, 1, dtype=torch.bool)], dim=-1)
    want, _ = entry.hyperexport_attention_forward(_Module(), q, k, v, fitting)
    got, _ = entry.hyperexport_attention_forward(_Module(), q, k, v, longer)
    torch.testing.assert_close(got, want)
    reference = _sdpa(q, k, v, attn_mask=fitting).transpose(1, 2)
    torch.testing.assert_close(got, reference)

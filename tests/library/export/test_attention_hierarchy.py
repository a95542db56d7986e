"""Issue 5 acceptance on the hierarchical export: one default-domain Attention per layer function."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from hyperexport import AttentionOptions, ExportOptions, RewriteOptions, zoo
from tests.helpers.exports import export_bytes
from tests.helpers.ort import run_ort
from tests.helpers.release_skips import NEEDS_HYPEREXPORT_ATTENTION, NEEDS_OPSET_18


@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_OPSET_18
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_llama_gqa_layers_promote_to_opset24_attention(dynamo: bool) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=4, num_heads=4, num_kv_heads=2)  # GQA 4:2, head_dim 16
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    want = model(input_ids=ids).last_hidden_state.detach().numpy()
    options = ExportOptions(
        attention=AttentionOptions("hyperexport"), rewrite=RewriteOptions(fuse="standard")
    )
    data, manifest = export_bytes(
        model, (ids,), hiera=[LlamaDecoderLayer], dynamo=dynamo, opset_version=18, options=options
    )
    proto = onnx.load_from_string(data)
    assert {o.domain: o.version for o in proto.opset_import}[""] == 24
    assert not [n for n in proto.graph.node if n.op_type == "Attention"]
    assert len(proto.functions) == 4
    for function in proto.functions:
        attention = [n for n in function.node if n.op_type == "Attention"]
        assert len(attention) == 1 and attention[0].domain == ""
        scale = {a.name: a for a in attention[0].attribute}["scale"].f
        assert scale == pytest.approx(16**-0.5)
        assert {o.domain: o.version for o in function.opset_import}[""] == 24
    assert manifest.opset == 24
    np.testing.assert_allclose(run_ort(data, [ids.numpy()])[0], want, atol=1e-4)

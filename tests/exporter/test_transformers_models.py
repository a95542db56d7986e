"""Real transformers architectures (small configs, seeded weights) through the TorchScript path."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from hyperexport import ExportOptions, zoo
from tests.exporter.conftest import export_bytes, flat_outputs, run_ort


def _check(
    model, args, hiera, expected_calls: dict[str, int], mode: str = "per_instance", atol=1e-4
):
    data, manifest = export_bytes(
        model, args, hiera=hiera, dynamo=False, options=ExportOptions(functions=mode)
    )
    proto = onnx.load_from_string(data)
    counts: dict[str, int] = {}
    for call in manifest.calls:
        short = next(f.class_name for f in manifest.functions if f.name == call.name).rsplit(
            ".", 1
        )[-1]
        counts[short] = counts.get(short, 0) + 1
    assert counts == expected_calls
    assert not [n for n in proto.graph.node if n.domain == "hyperexport.placeholder"]
    got = run_ort(data, [a.numpy() for a in args])
    want = flat_outputs(model(*args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=atol)
    return proto, manifest


@pytest.mark.parametrize("mode", ["per_instance", "per_type"])
def test_llama_4_layers(mode: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=4)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    proto, _ = _check(model, (ids,), [LlamaDecoderLayer], {"LlamaDecoderLayer": 4}, mode)
    main_calls = [n for n in proto.graph.node if n.domain == "hyperexport.fn"]
    assert len(main_calls) == 4  # one call per instance in the main graph
    fns = sorted(f.name for f in proto.functions)
    if mode == "per_type":
        assert fns == ["LlamaDecoderLayer"]
    else:
        assert fns == [f"LlamaDecoderLayer_layers_{i}" for i in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["per_instance", "per_type"])
def test_llama_16_layers(mode: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=16)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    _check(model, (ids,), [LlamaDecoderLayer], {"LlamaDecoderLayer": 16}, mode)


def test_resnet_stages_and_layers() -> None:
    from transformers.models.resnet.modeling_resnet import ResNetBasicLayer, ResNetStage

    model = zoo.tiny_resnet()
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    _check(
        model, (pixels,), [ResNetStage, ResNetBasicLayer], {"ResNetStage": 4, "ResNetBasicLayer": 4}
    )


def test_vit_layers() -> None:
    from transformers.models.vit.modeling_vit import ViTLayer

    model = zoo.tiny_vit()
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    _check(model, (pixels,), [ViTLayer], {"ViTLayer": 2})


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize(
    ("factory", "hiera", "expected"),
    [
        (
            zoo.tiny_bert,
            [
                "transformers.models.bert.modeling_bert.BertLayer",
                "transformers.models.bert.modeling_bert.BertAttention",
            ],
            ["BertLayer", "BertAttention"],
        ),
        (zoo.tiny_gpt2, ["transformers.models.gpt2.modeling_gpt2.GPT2Block"], ["GPT2Block"]),
        (
            zoo.tiny_qwen2,
            ["transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer"],
            ["Qwen2DecoderLayer"],
        ),
    ],
    ids=["bert-nested", "gpt2", "qwen2"],
)
def test_more_families_per_type_on_both_paths(factory, hiera, expected, dynamo: bool) -> None:
    model = factory()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    data, manifest = export_bytes(
        model, (ids,), hiera=hiera, dynamo=dynamo, options=ExportOptions(functions="per_type")
    )
    assert [f.name for f in manifest.functions] == expected
    want = model(input_ids=ids).last_hidden_state.detach().numpy()
    np.testing.assert_allclose(run_ort(data, [ids.numpy()])[0], want, atol=1e-4)

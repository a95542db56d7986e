"""Real transformers architectures (small configs, seeded weights) exported on both paths.

Each model is exported with ``export_hyper_onnx``, full-checked, run on ONNX Runtime against
torch, and its functions and call sites are asserted by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from hyperexport import ExportOptions, zoo
from hyperexport.base import versions
from hyperexport.base.contracts.manifest import (
    FUNCTION_DOMAIN,
    META_EXPORT_PATH,
    PLACEHOLDER_DOMAIN,
)
from tests.helpers.exports import export_bytes
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.ort import assert_outputs_close, run_ort

PATHS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo")]
MODES = ["per_instance", "per_type"]
ATOL = 1e-4


def export_and_compare(
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    hiera: list[Any],
    dynamo: bool,
    mode: str,
) -> tuple[onnx.ModelProto, dict[str, int]]:
    """Export, assert ORT matches torch; return the model and the manifest's calls per class."""
    data, manifest = export_bytes(
        model,
        args,
        hiera=hiera,
        dynamo=dynamo,
        opset_version=TEST_OPSET,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
    )
    proto = onnx.load_from_string(data)
    every_node = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    assert not [n for n in every_node if n.domain == PLACEHOLDER_DOMAIN]
    assert all(f.domain == FUNCTION_DOMAIN for f in proto.functions)
    assert {p.key: p.value for p in proto.metadata_props}[META_EXPORT_PATH] == f"dynamo={dynamo}"
    with torch.no_grad():
        assert_outputs_close(run_ort(data, [a.numpy() for a in args]), model(*args), ATOL)
    classes = {f.name: f.class_name.rsplit(".", 1)[-1] for f in manifest.functions}
    counts: dict[str, int] = {}
    for call in manifest.calls:
        counts[classes[call.name]] = counts.get(classes[call.name], 0) + 1
    return proto, counts


def _llama(num_layers: int, dynamo: bool, mode: str) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=num_layers)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    proto, counts = export_and_compare(model, (ids,), [LlamaDecoderLayer], dynamo, mode)
    assert counts == {"LlamaDecoderLayer": num_layers}
    names = (
        {"LlamaDecoderLayer"}
        if mode == "per_type"
        else {f"LlamaDecoderLayer_layers_{i}" for i in range(num_layers)}
    )
    assert {f.name for f in proto.functions} == names
    calls = [n for n in proto.graph.node if n.domain == FUNCTION_DOMAIN]
    assert [n.name for n in calls] == [f"layers.{i}" for i in range(num_layers)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_llama_4_layers(dynamo: bool, mode: str) -> None:
    _llama(4, dynamo, mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_llama_16_layers(dynamo: bool, mode: str) -> None:
    _llama(16, dynamo, mode)


#: The dynamo case of ResNet where torch's own plain export fails too
#: (:func:`test_torch_plain_dynamo_export_of_resnet_fails_on_those_releases`).
RESNET_PATHS = [
    PATHS[0],
    pytest.param(
        True,
        id="dynamo",
        marks=pytest.mark.xfail(
            versions.dynamo_fails_eval_batch_norm(),
            reason=f"torch {versions.torch_version()}'s dynamo exporter cannot translate an "
            "eval-mode batch norm (versions.DYNAMO_FAILS_EVAL_BATCH_NORM)",
            strict=True,
        ),
    ),
]


@pytest.mark.skipif(
    not versions.dynamo_fails_eval_batch_norm() or bool(versions.unsupported(True)),
    reason="torch's dynamo exporter translates ResNet's batch norm here "
    "(or the dynamo path is refused)",
)
def test_torch_plain_dynamo_export_of_resnet_fails_on_those_releases(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="Failed to convert the exported program"):
        torch.onnx.export(
            zoo.tiny_resnet().eval(),
            (torch.randn(1, 3, 32, 32),),
            str(tmp_path / "plain.onnx"),
            dynamo=True,
            opset_version=TEST_OPSET,
        )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", RESNET_PATHS)
def test_resnet_stages_and_layers(dynamo: bool, mode: str) -> None:
    from transformers.models.resnet.modeling_resnet import ResNetBasicLayer, ResNetStage

    model = zoo.tiny_resnet()
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    proto, counts = export_and_compare(
        model, (pixels,), [ResNetStage, ResNetBasicLayer], dynamo, mode
    )
    assert counts == {"ResNetStage": 4, "ResNetBasicLayer": 4}
    if mode == "per_type":
        # Every stage has other channel counts: four variants of each class.
        suffixes = ["", "_v2", "_v3", "_v4"]
        names = {f"ResNetStage{s}" for s in suffixes} | {f"ResNetBasicLayer{s}" for s in suffixes}
    else:
        names = {f"ResNetStage_encoder_stages_{i}" for i in range(4)} | {
            f"ResNetBasicLayer_encoder_stages_{i}_layers_0" for i in range(4)
        }
    assert {f.name for f in proto.functions} == names


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_vit_layers(dynamo: bool, mode: str) -> None:
    from transformers.models.vit.modeling_vit import ViTLayer

    model = zoo.tiny_vit(num_layers=2)
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    proto, counts = export_and_compare(model, (pixels,), [ViTLayer], dynamo, mode)
    assert counts == {"ViTLayer": 2}
    # The layers' path: "layers.0" in transformers 5.x, "encoder.layer.0" in 4.57.
    paths = [name for name, m in model.named_modules() if isinstance(m, ViTLayer)]
    per_instance = {"ViTLayer_" + path.replace(".", "_") for path in paths}
    names = {"ViTLayer"} if mode == "per_type" else per_instance
    assert {f.name for f in proto.functions} == names


@pytest.mark.parametrize("dynamo", PATHS)
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
    np.testing.assert_allclose(run_ort(data, [ids.numpy()])[0], want, atol=ATOL)

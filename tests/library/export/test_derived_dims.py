"""Issue 22 item 4: a dynamic dimension a hiera child derives from its inputs (a strided conv's
output length, H/2 of an image) is its own symbolic dimension, on both export paths.

Every export here is traced at one shape, probed at a second that differs on every dynamic
axis (and so on every derived one), and compared with torch in ONNX Runtime at shapes it was
traced at neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from hyperexport import ExportOptions
from hyperexport.library.api import capture_model
from hyperexport.library.capture import tree
from hyperexport.library.export.placeholders import symbolic_output_dims
from tests.helpers.exports import export_bytes
from tests.helpers.models import SMALL_SPEECH_CONFIG
from tests.helpers.ort import run_ort

PATHS = pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])


class Down(torch.nn.Module):
    """Halves the length: its output length is derived, equal to no input dimension."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(channels, channels, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Mix(torch.nn.Module):
    """Runs on the derived length (its input), with a Down nested inside."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.down = Down(channels)
        self.proj = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(x).transpose(1, 2)
        return self.proj(y) * y.shape[1]


class Net(torch.nn.Module):
    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.stem = Down(channels)
        self.mix = Mix(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        out = self.mix(h)
        # The root reads the derived length too: it must not be a traced constant.
        return out + torch.arange(out.shape[1], dtype=out.dtype)[None, :, None]


def _shapes(value: Any) -> list[tuple[int, ...]]:
    tensors: list[torch.Tensor] = []
    tree.flatten(value, "output", tensors)
    return [tuple(t.shape) for t in tensors]


def test_a_derived_output_dimension_is_marked_none_and_a_tied_one_names_its_input() -> None:
    torch.manual_seed(0)
    capture = capture_model(
        Net().eval(),
        (torch.randn(2, 4, 41),),
        hiera=[Down, Mix],
        dynamic_axes={"x": {0: "batch", 2: "length"}},
        probe_shapes={"x": (3, 4, 60)},
    )
    record = capture.record
    stem = next(c for c in record.calls if c.path == "stem")
    # Batch follows input 0's axis 0; the length (41 -> 20, 60 -> 29) is derived.
    assert symbolic_output_dims(record, stem) == (((0, 0), 4, None),)
    mix = next(c for c in record.calls if c.path == "mix")
    assert symbolic_output_dims(record, mix) == (((0, 0), None, 4),)


@pytest.mark.parametrize(
    ("mode", "dynamo"),
    [("per_type", False), ("per_instance", False), ("per_type", True)],
    ids=["per_type-torchscript", "per_instance-torchscript", "per_type-dynamo"],
)
def test_derived_lengths_stay_symbolic_through_functions(dynamo: bool, mode: str) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    options = ExportOptions(functions=mode, probe_shapes=(("x", (3, 4, 60)),))  # type: ignore[arg-type]
    data, _ = export_bytes(
        model,
        (torch.randn(2, 4, 41),),
        input_names=["x"],
        hiera=[Down, Mix],
        dynamo=dynamo,
        dynamic_axes={"x": {0: "batch", 2: "length"}},
        options=options,
    )
    proto = onnx.load_from_string(data)
    assert {f.name.split("_")[0] for f in proto.functions} == {"Down", "Mix"}
    out_dims = proto.graph.output[0].type.tensor_type.shape.dim
    assert out_dims[0].dim_param == "batch" and out_dims[1].dim_param  # derived, not fixed
    for shape, seed in (((1, 4, 33), 1), ((4, 4, 101), 2)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        want = model(x).detach().numpy()
        got = run_ort(data, [x.numpy()])[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)


def _compare(
    model: torch.nn.Module, data: bytes, name: str, shapes: Sequence[tuple[int, ...]]
) -> None:
    for seed, shape in enumerate(shapes):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            out = model(x)
        want = [t.numpy() for t in _tensors(out)]
        got = run_ort(data, {name: x.numpy()})
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-4)


def _tensors(value: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    tree.flatten(value, "output", tensors)
    return tensors


def _speech(kind: str) -> tuple[torch.nn.Module, list[type]]:
    torch.manual_seed(0)
    if kind == "wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2Model
        from transformers.models.wav2vec2 import modeling_wav2vec2 as w

        return Wav2Vec2Model(Wav2Vec2Config(**SMALL_SPEECH_CONFIG)).eval(), [
            w.Wav2Vec2EncoderLayer,
            w.Wav2Vec2GroupNormConvLayer,
            w.Wav2Vec2NoLayerNormConvLayer,
        ]
    from transformers import HubertConfig, HubertModel
    from transformers.models.hubert import modeling_hubert as h

    return HubertModel(HubertConfig(**SMALL_SPEECH_CONFIG)).eval(), [
        h.HubertEncoderLayer,
        h.HubertGroupNormConvLayer,
        h.HubertNoLayerNormConvLayer,
    ]


@pytest.mark.slow
@PATHS
@pytest.mark.parametrize("kind", ["wav2vec2", "hubert"])
def test_speech_encoders_with_conv_and_encoder_layer_functions(kind: str, dynamo: bool) -> None:
    """The conv feature layers (derived lengths) and the encoder layers are all functions."""
    model, hiera = _speech(kind)
    data, _ = export_bytes(
        model,
        (torch.randn(2, 4000),),
        input_names=["input_values"],
        hiera=hiera,
        dynamo=dynamo,
        dynamic_axes={"input_values": {0: "batch", 1: "samples"}},
        options=ExportOptions(probe_shapes=(("input_values", (3, 3200)),)),
    )
    proto = onnx.load_from_string(data)
    assert len({f.name.split("_")[0] for f in proto.functions}) == 3
    _compare(model, data, "input_values", [(1, 5000), (3, 3211)])


@pytest.mark.slow
@PATHS
def test_resnet_with_dynamic_image_size(dynamo: bool) -> None:
    from transformers import ResNetConfig, ResNetModel
    from transformers.models.resnet import modeling_resnet as r

    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    model = ResNetModel(config).eval()
    data, _ = export_bytes(
        model,
        (torch.randn(2, 3, 32, 40),),
        input_names=["pixel_values"],
        hiera=[r.ResNetStage, r.ResNetBasicLayer],
        dynamo=dynamo,
        dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}},
        options=ExportOptions(probe_shapes=(("pixel_values", (3, 3, 48, 24)),)),
    )
    dims = onnx.load_from_string(data).graph.output[0].type.tensor_type.shape.dim
    assert all(d.dim_param for d in (dims[2], dims[3]))
    _compare(model, data, "pixel_values", [(1, 3, 64, 33), (3, 3, 17, 29)])

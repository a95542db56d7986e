"""Issue 22 item 4 through the build: speech checkpoints with ``inputs: auto`` and
``dynamic: auto`` (batch and samples dynamic; the encoder's length is derived from the samples
by the conv feature encoder) and ``hiera`` set to the encoder layer, on both export paths. The
check compares ONNX Runtime with torch at the traced and at the second shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.product.builds.session import run_build
from hyperexport.product.config import BuildSettings, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.models import SMALL_SPEECH_CONFIG


def _checkpoint(kind: str, path: Path) -> str:
    import torch

    torch.manual_seed(0)
    if kind == "wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2Model

        Wav2Vec2Model(Wav2Vec2Config(**SMALL_SPEECH_CONFIG)).save_pretrained(path)
        return "transformers.models.wav2vec2.modeling_wav2vec2.Wav2Vec2EncoderLayer"
    from transformers import HubertConfig, HubertModel

    HubertModel(HubertConfig(**SMALL_SPEECH_CONFIG)).save_pretrained(path)
    return "transformers.models.hubert.modeling_hubert.HubertEncoderLayer"


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", ["wav2vec2", "hubert"])
def test_speech_builds_with_dynamic_auto(kind: str, dynamo: bool, tmp_path: Path) -> None:
    layer = _checkpoint(kind, tmp_path / kind)
    data = {
        "name": kind,
        "model": {"_target_": "hyperexport.models.pretrained", "path": str(tmp_path / kind)},
        "inputs": "auto",
        "hiera": [layer],
        "dynamic": "auto",
        "dynamo": dynamo,
    }
    recipe = validate_recipe(data, str(tmp_path / f"{kind}.yaml"))
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "out", False, ())
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.result.error
    report = outcome.report
    assert report is not None and report["check"]["ok"]
    outputs = {o["name"]: o for o in report["check"]["end_to_end"]["outputs"]}
    assert "last_hidden_state@second_shape" in outputs
    assert all(o["max_abs"] <= 1e-4 for o in outputs.values())
    classes = {f["class"].rsplit(".", 1)[-1] for f in report["functions"]}
    assert classes == {layer.rsplit(".", 1)[-1]}

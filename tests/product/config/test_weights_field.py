"""``weights``: which recipes can stream, refused in one line naming the field otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from hyperexport.base.errors import RecipeError
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.schema import stage_reads
from tests.helpers.release_skips import NEEDS_DECODING_TASKS

_LAYER = "transformers.models.llama.modeling_llama.LlamaDecoderLayer"


def _recipe(model: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "name": "t",
        "model": model,
        "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": [_LAYER],
        "dynamo": False,
        **fields,
    }


def _folder(tmp_path: Path, weights: str = "model.safetensors", **config: Any) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    if weights.endswith(".safetensors"):
        save_file({"w": np.zeros(2, np.float32)}, tmp_path / weights)
    else:
        (tmp_path / weights).write_bytes(b"pickle")
    return tmp_path


def _pretrained(folder: Path) -> dict[str, Any]:
    return {"_target_": "hyperexport.models.pretrained", "path": str(folder)}


def test_default_is_auto_and_the_model_stages_read_it() -> None:
    recipe = validate_recipe(_recipe({"_target_": "hyperexport.zoo.tiny_llama"}), "/r/t.yaml")
    assert recipe.data["weights"] == "auto"
    assert "weights" in stage_reads("trace") and "weights" in stage_reads("export")
    assert "weights" not in stage_reads("rewrite")


def test_a_local_safetensors_checkpoint_streams(tmp_path: Path) -> None:
    recipe = validate_recipe(_recipe(_pretrained(_folder(tmp_path)), weights="stream"), "r.yaml")
    assert recipe.data["weights"] == "stream"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("factory", r"weights come from the factory 'hyperexport.zoo.tiny_llama'"),
        ("bin", r"holds no \.safetensors file"),
        ("quantized", r"quantized checkpoint \(gptq\)"),
        pytest.param("generation", r"only task forward streams", marks=NEEDS_DECODING_TASKS),
        ("pickle_checkpoint", r"torch pickle"),
        ("fallback", r"set fallback: false to stream"),
    ],
)
def test_what_cannot_stream_is_refused_naming_weights(
    tmp_path: Path, case: str, message: str
) -> None:
    fields: dict[str, Any] = {"weights": "stream"}
    model = _pretrained(_folder(tmp_path))
    if case == "factory":
        model = {"_target_": "hyperexport.zoo.tiny_llama"}
    elif case == "bin":
        (tmp_path / "bin").mkdir()
        model = _pretrained(_folder(tmp_path / "bin", "pytorch_model.bin"))
    elif case == "quantized":
        sub = tmp_path / "q"
        sub.mkdir()
        model = _pretrained(_folder(sub, quantization_config={"quant_method": "gptq"}))
    elif case == "generation":
        fields.update(task="text-generation", generation={"prompts": [[1, 2]]})
    elif case == "fallback":
        fields[case] = True
    elif case == "pickle_checkpoint":
        model = {"_target_": "hyperexport.zoo.tiny_llama"}
        (tmp_path / "sd.pt").write_bytes(b"pickle")
        fields["checkpoint"] = str(tmp_path / "sd.pt")
    with pytest.raises(RecipeError, match=rf"field 'weights': stream needs .*{message}"):
        validate_recipe(_recipe(model, **fields), "r.yaml")


def test_load_and_auto_never_refuse(tmp_path: Path) -> None:
    model = {"_target_": "hyperexport.zoo.tiny_llama"}
    for weights in ("load", "auto"):
        assert validate_recipe(_recipe(model, weights=weights), "r.yaml").data["weights"] == weights
    with pytest.raises(RecipeError, match="field 'weights'"):
        validate_recipe(_recipe(model, weights="mapped"), "r.yaml")

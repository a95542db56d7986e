"""``weights``: the loader of a streamed recipe returns a skeleton with the mapped checkpoint
attached; ``auto`` streams only when loading would not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hyperexport import zoo
from hyperexport.base.errors import RecipeError
from hyperexport.library.capture.streaming import streamed_checkpoint
from hyperexport.product.config import validate_recipe
from hyperexport.product.from_recipe.model import model_loader
from hyperexport.product.from_recipe.weights import streaming_source

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


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    zoo.tiny_llama(num_layers=2, causal_lm=True).to(torch.bfloat16).save_pretrained(tmp_path)
    return tmp_path


def _pretrained(folder: Path) -> dict[str, Any]:
    return {
        "_target_": "hyperexport.models.pretrained",
        "path": str(folder),
        "auto_class": "AutoModelForCausalLM",
        "dtype": "bfloat16",
    }


def test_stream_loads_a_skeleton_with_the_checkpoint_attached(checkpoint: Path) -> None:
    recipe = validate_recipe(_recipe(_pretrained(checkpoint), weights="stream"), "r.yaml")
    model = model_loader(recipe)()
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # rotary frequencies are computed
    mapped = streamed_checkpoint(model)
    assert mapped is not None and mapped.index.nbytes() == sum(
        p.numel() * 2 for p in model.parameters()
    )
    loaded = model_loader(validate_recipe(_recipe(_pretrained(checkpoint)), "r.yaml"))()
    assert streamed_checkpoint(loaded) is None and not any(p.is_meta for p in loaded.parameters())


def test_a_factory_with_a_safetensors_checkpoint_streams(tmp_path: Path) -> None:
    save_file(zoo.tiny_llama(num_layers=2).state_dict(), tmp_path / "weights.safetensors")
    model_cfg = {"_target_": "hyperexport.zoo.tiny_llama", "num_layers": 2}
    fields = {"weights": "stream", "checkpoint": str(tmp_path / "weights.safetensors")}
    model = model_loader(validate_recipe(_recipe(model_cfg, **fields), "r.yaml"))()
    assert all(p.is_meta for p in model.parameters()) and streamed_checkpoint(model) is not None


def test_a_checkpoint_that_is_not_the_models_is_refused_naming_the_tensor(
    checkpoint: Path,
) -> None:
    save_file({"extra.weight": torch.zeros(2)}, checkpoint / "extra.safetensors")
    recipe = validate_recipe(_recipe(_pretrained(checkpoint), weights="stream"), "r.yaml")
    with pytest.raises(RecipeError, match=r"field 'weights'.*'extra.weight'.*no such weight"):
        model_loader(recipe)()


def test_auto_streams_only_what_does_not_fit(checkpoint: Path) -> None:
    model = _pretrained(checkpoint)
    chosen = [
        streaming_source("auto", model, None, "r.yaml", "forward", available=free)
        for free in (1 << 20, 1 << 40)
    ]
    assert chosen[0] is not None and chosen[0][0].folder == checkpoint
    assert chosen[1] is None
    factory = {"_target_": "hyperexport.zoo.tiny_llama"}
    assert streaming_source("auto", factory, None, "r.yaml", "forward", available=1) is None
    assert streaming_source("load", model, None, "r.yaml", "forward", available=1) is None

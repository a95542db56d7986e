"""``weights``: the loader of a streamed recipe returns a skeleton with the mapped checkpoint
attached; ``auto`` streams only when loading would not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from hyperexport import zoo
from hyperexport.base.contracts.weight_index import read_weight_index
from hyperexport.base.errors import RecipeError
from hyperexport.library.capture.streaming import streamed_checkpoint
from hyperexport.library.export_budget import BASELINE_BYTES, EXPORT_OVERHEAD, streaming_need
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


def test_auto_streams_only_what_does_not_fit(tmp_path: Path) -> None:
    # six layers: loading (every weight, with the export's overhead) needs more than streaming
    # (the largest layer's float32 copies for the check)
    zoo.tiny_llama(num_layers=6, causal_lm=True).to(torch.bfloat16).save_pretrained(tmp_path)
    model = _pretrained(tmp_path)
    index = read_weight_index(tmp_path)
    loading = int(index.nbytes() * (1 + EXPORT_OVERHEAD)) + BASELINE_BYTES
    streaming = streaming_need(index, "bfloat16").total
    assert streaming < loading
    chosen = [
        streaming_source("auto", model, None, "r.yaml", "forward", available=free)
        for free in ((streaming + loading) // 2, 1 << 40)
    ]
    assert chosen[0] is not None and chosen[0][0].folder == tmp_path
    assert chosen[1] is None
    factory = {"_target_": "hyperexport.zoo.tiny_llama"}
    assert streaming_source("auto", factory, None, "r.yaml", "forward", available=1) is None
    assert streaming_source("load", model, None, "r.yaml", "forward", available=1) is None


def test_a_streamed_build_that_cannot_fit_either_stops_before_anything_runs(
    checkpoint: Path,
) -> None:
    for weights in ("stream", "auto"):
        with pytest.raises(
            RecipeError,
            match=r"field 'weights'.*a streamed build needs about 512\.\d MiB \(largest layer "
            r"model\.layers\.0: \d+\.\d KiB in float32 for the check\), 1\.0 MiB is available",
        ):
            streaming_source(weights, _pretrained(checkpoint), None, "r.yaml", "forward", 1 << 20)

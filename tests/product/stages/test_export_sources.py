"""The export stage declares where ``units/weights.data``'s bytes are when the model's weights
are its checkpoint's (loaded in the stored dtype, or streamed), and the declaration holds byte
for byte; a factory's model, without a checkpoint, declares nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from hyperexport import zoo
from hyperexport.engine.sourced import FileSources, matching_digest
from hyperexport.engine.stage import StageInputs, config_slice
from hyperexport.library.capture.streaming import streamed_checkpoint
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.schema import stage_reads
from hyperexport.product.from_recipe.model import model_loader
from hyperexport.product.stages.export import ExportStage
from hyperexport.product.stages.trace import TraceStage

_LLAMA = "transformers.models.llama.modeling_llama.LlamaDecoderLayer"


def _recipe(model: dict[str, Any], weights: str, dynamo: bool) -> dict[str, Any]:
    return {
        "name": "t",
        "model": model,
        "inputs": {"input_ids": {"shape": [1, 6], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": [_LLAMA],
        "dynamo": dynamo,
        "weights": weights,
    }


def _pretrained(folder: Path) -> dict[str, Any]:
    return {
        "_target_": "hyperexport.models.pretrained",
        "path": str(folder),
        "auto_class": "AutoModelForCausalLM",
    }


def _export(tmp_path: Path, data: dict[str, Any]) -> tuple[Path, list[tuple[Path, FileSources]]]:
    """Run trace then export on ``data``; the export folder and what it declared."""
    recipe = validate_recipe(data, "r.yaml")
    model = model_loader(recipe)()
    assert (streamed_checkpoint(model) is not None) == (data["weights"] == "stream")
    trace, export = tmp_path / "trace", tmp_path / "export"
    trace.mkdir()
    export.mkdir()
    TraceStage().run(
        config_slice(recipe.data, stage_reads("trace")),
        StageInputs({}, lambda: model, "r.yaml"),
        trace,
    )
    declared: list[tuple[Path, FileSources]] = []
    ExportStage().run(
        config_slice(recipe.data, stage_reads("export")),
        StageInputs(
            {"trace": trace},
            lambda: model,
            "r.yaml",
            declare_sources=lambda path, sources: declared.append((path, sources)),
        ),
        export,
    )
    return export, declared


@pytest.mark.parametrize(
    ("weights", "dynamo"),
    [("load", False), ("load", True), ("stream", False), ("stream", True)],
    ids=["load-torchscript", "load-dynamo", "stream-torchscript", "stream-dynamo"],
)
def test_the_weights_of_a_checkpoint_are_declared_as_its_ranges(
    tmp_path: Path, weights: str, dynamo: bool
) -> None:
    checkpoint = tmp_path / "ckpt"
    zoo.tiny_llama(num_layers=2, causal_lm=True).save_pretrained(checkpoint)
    export, declared = _export(tmp_path, _recipe(_pretrained(checkpoint), weights, dynamo))
    data = export / "units" / "weights.data"
    assert [path for path, _ in declared] == [data]
    sources = declared[0][1]
    assert {p.source for p in sources.pieces} == {str((checkpoint / "model.safetensors").resolve())}
    assert matching_digest(data, sources) == hashlib.sha256(data.read_bytes()).hexdigest()


@pytest.mark.parametrize("weights", ["load", "stream"])
def test_a_model_loaded_in_another_dtype_declares_nothing(tmp_path: Path, weights: str) -> None:
    checkpoint = tmp_path / "ckpt"
    zoo.tiny_llama(num_layers=2, causal_lm=True).to(torch.bfloat16).save_pretrained(checkpoint)
    model = {**_pretrained(checkpoint), "dtype": "float32"}
    export, declared = _export(tmp_path, _recipe(model, weights, False))
    assert (export / "units" / "weights.data").stat().st_size > 0
    assert declared == []


def test_a_factory_model_declares_nothing(tmp_path: Path) -> None:
    model = {"_target_": "hyperexport.zoo.tiny_llama", "num_layers": 2}
    export, declared = _export(tmp_path, _recipe(model, "load", False))
    assert (export / "units" / "weights.data").stat().st_size > 0
    assert declared == []


@pytest.mark.parametrize(
    ("weights", "stored", "loaded", "copies"),
    [
        ("load", torch.float32, None, 1),
        ("stream", torch.bfloat16, "bfloat16", 1),
        ("load", torch.bfloat16, "float32", 2),
        ("stream", torch.bfloat16, "float32", 2),
    ],
    ids=["load-same", "stream-same", "load-converted", "stream-converted"],
)
def test_the_disk_budget_counts_one_copy_where_the_cache_records_ranges(
    tmp_path: Path, weights: str, stored: torch.dtype, loaded: str | None, copies: int
) -> None:
    """The export refuses, before writing, weights its disk cannot hold: once when the cache will
    record them as ranges of the checkpoint, twice (a blob as well) when they are converted."""
    from hyperexport.product.config.fields import from_json
    from hyperexport.product.config.schema import RecipeConfig
    from hyperexport.product.stages.export import _checkpoint_locator, _disk_copies

    checkpoint = tmp_path / "ckpt"
    zoo.tiny_llama(num_layers=2, causal_lm=True).to(stored).save_pretrained(checkpoint)
    model = {**_pretrained(checkpoint), **({"dtype": loaded} if loaded else {})}
    recipe = validate_recipe(_recipe(model, weights, False), "r.yaml")
    live = model_loader(recipe)()
    typed = from_json(RecipeConfig, recipe.data, partial=True)
    assert _disk_copies(live, _checkpoint_locator(live, typed, "r.yaml")) == copies
    assert _disk_copies(zoo.tiny_llama(num_layers=2), None) == 2  # a factory's: no checkpoint

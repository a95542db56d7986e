"""A streamed build (``weights: stream``) publishes the loaded build's files, byte for byte, and
passes its check, on both export paths; no weight stays bound after the model's stages."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from hyperexport import zoo
from hyperexport.product.config import validate_recipe
from tests.helpers.builds import build
from tests.helpers.release_skips import NEEDS_BFLOAT16_SDPA_MASK

_FILES = ("model.onnx", "model.onnx.data", "manifest.json")


def _recipe(folder: Path, weights: str, functions: str, dynamo: bool) -> dict[str, Any]:
    return {
        "name": f"s_{weights}",
        "model": {
            "_target_": "hyperexport.models.pretrained",
            "path": str(folder),
            "auto_class": "AutoModelForCausalLM",
            "dtype": "bfloat16",
        },
        "inputs": {"input_ids": {"shape": [1, 6], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
        "dynamo": dynamo,
        "functions": functions,
        "external_data": True,
        "weights": weights,
    }


def _published(tmp_path: Path, name: str) -> dict[str, bytes]:
    folder = tmp_path / "outputs" / name / "default"
    return {f: (folder / f).read_bytes() for f in _FILES}


@pytest.mark.parametrize(
    "dynamo",
    # a bfloat16 checkpoint: on the TorchScript path, its attention mask is bfloat16
    [pytest.param(False, marks=NEEDS_BFLOAT16_SDPA_MASK), True],
    ids=["torchscript", "dynamo"],
)
def test_streamed_build_publishes_the_loaded_builds_bytes(
    tmp_path: Path, dynamo: bool, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = tmp_path / "ckpt"
    # Large enough that the layers' matrices go to the data file (not inlined).
    zoo.tiny_llama(num_layers=3, causal_lm=True, hidden_size=64, intermediate_size=128).to(
        torch.bfloat16
    ).save_pretrained(checkpoint)
    for functions in ("per_type", "per_instance"):
        published = {}
        for weights in ("load", "stream"):
            recipe = validate_recipe(_recipe(checkpoint, weights, functions, dynamo), "r.yaml")
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="hyperexport"):
                outcome = build(recipe, tmp_path, cache=f"cache_{functions}")
            if weights == "stream" and dynamo:
                # One program, one layer's weights: the body's representative; two stand-ins.
                assert "streamed export: 1 of 3 hiera instances bound" in caplog.text
            assert outcome.exit_code == 0, outcome.report
            assert outcome.report is not None and outcome.report["check"]["ok"] is True
            published[weights] = _published(tmp_path, recipe.name)
        for name in _FILES:
            assert published["stream"][name] == published["load"][name], (functions, name)

"""The trace stage of a streamed recipe writes the same files, byte for byte, as the loaded one,
with no layer's weights left bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hyperexport import zoo
from hyperexport.engine.stage import StageInputs, config_slice
from hyperexport.library.capture.streaming import streamed_checkpoint
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.schema import stage_reads
from hyperexport.product.from_recipe.model import model_loader
from hyperexport.product.stages.trace import TraceStage


def _recipe(folder: Path, weights: str, dynamo: bool) -> dict[str, Any]:
    return {
        "name": "t",
        "model": {
            "_target_": "hyperexport.models.pretrained",
            "path": str(folder),
            "auto_class": "AutoModelForCausalLM",
            "dtype": "bfloat16",
        },
        "inputs": {"input_ids": {"shape": [1, 6], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
        "dynamo": dynamo,
        "weights": weights,
    }


# The dynamo path captures streamed too (tests/library/capture/test_streaming.py), but its export does
# not stream yet, so validation refuses weights: stream with dynamo: true.
def test_streamed_trace_writes_the_loaded_traces_bytes(
    tmp_path: Path, dynamo: bool = False
) -> None:
    checkpoint = tmp_path / "ckpt"
    zoo.tiny_llama(num_layers=2, causal_lm=True).to(torch.bfloat16).save_pretrained(checkpoint)
    written: dict[str, dict[str, bytes]] = {}
    for weights in ("load", "stream"):
        recipe = validate_recipe(_recipe(checkpoint, weights, dynamo), "r.yaml")
        model = model_loader(recipe)()
        assert (streamed_checkpoint(model) is not None) == (weights == "stream")
        out = tmp_path / weights
        out.mkdir()
        params = config_slice(recipe.data, stage_reads("trace"))
        TraceStage().run(params, StageInputs({}, lambda m=model: m, "r.yaml"), out)
        written[weights] = {p.name: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        if weights == "stream":  # every weight back on the meta device after the stage
            assert all(p.is_meta for p in model.parameters())
    assert written["stream"].keys() == written["load"].keys()
    assert {"capture.json", "tensors.npz"} <= written["load"].keys()
    for name, content in written["load"].items():
        assert written["stream"][name] == content, name

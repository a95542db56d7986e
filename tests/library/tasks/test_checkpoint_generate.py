"""task: text-generation on a ``hyperexport.models.pretrained`` checkpoint: the folder gets the
checkpoint's tokenizer files (hashed into the key), and float16 decodes as transformers does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyperexport.product.builds.session import run_build
from hyperexport.product.config import compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH
from tests.helpers.release_skips import NEEDS_DECODING_TASKS

#: Each test builds or runs a decoding task.
pytestmark = NEEDS_DECODING_TASKS

PROMPTS = [[17, 93, 41, 8, 120, 66, 5], [71, 30, 99, 12]]


def _checkpoint(directory: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    # A tokenizer is data to the build: any bytes do; its digest must reach the key.
    (directory / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    (directory / "tokenizer_config.json").write_text(json.dumps({"unk_token": "t3"}))
    return directory


def _recipe(tmp_path: Path, checkpoint: Path) -> Path:
    recipe = tmp_path / "ckpt_generate.yaml"
    recipe.write_text(
        "# @package _global_\n"
        "name: ckpt_generate\n"
        f"model: {{_target_: hyperexport.models.pretrained, path: {checkpoint},"
        " auto_class: AutoModelForCausalLM}\n"
        "inputs: auto\nhiera: auto\ntask: text-generation\nfunctions: per_type\ndynamo: false\n"
        f"generation: {{prompts: {PROMPTS}, max_new_tokens: 16}}\n"
    )
    return recipe


def _build(tmp_path: Path, recipe: Path, *overrides: str, trace_only: bool = False) -> Any:
    composed, settings = compose_recipe(
        [
            *overrides,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ],
        recipe_file=recipe,
    )
    stages = PIPELINE[:1] if trace_only else PIPELINE  # the trace writes the folder's extras
    return run_build(composed, settings, stages=stages, load_model=model_loader(composed))


def test_the_folder_carries_the_tokenizer_and_its_digest_is_in_the_key(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "ckpt")
    recipe = _recipe(tmp_path, checkpoint)
    outcome = _build(tmp_path, recipe, trace_only=True)
    assert outcome.exit_code == 0, outcome.result.error
    folder = tmp_path / "out" / "ckpt_generate" / "default"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (checkpoint / name).read_bytes()
    genai = json.loads((folder / "genai_config.json").read_text())
    model = genai["model"]
    assert (model["type"], model["eos_token_id"], model["pad_token_id"]) == ("llama", 2, 0)
    assert genai["search"]["past_present_share_buffer"] is False

    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"unk_token": "t4"}))
    plan = _build(tmp_path, recipe, "build.dry_run=true", trace_only=True)
    status = {s.name: s.status for s in plan.result.stages}
    assert status["trace"] == "would_run"


@pytest.mark.zoo
@NEEDS_DYNAMO_PATH
def test_a_float16_checkpoint_decodes_in_onnxruntime_genai_as_transformers(
    tmp_path: Path,
) -> None:
    # float16 on the dynamo path (TorchScript makes type-inconsistent float16 decoders, see
    # recipes/README.md); onnxruntime-genai runs the model in float16.
    recipe = _recipe(tmp_path, _checkpoint(tmp_path / "ckpt"))
    outcome = _build(tmp_path, recipe, "+model.dtype=float16", "dynamo=true")
    assert outcome.exit_code == 0, outcome.result.error
    folder = tmp_path / "out" / "ckpt_generate"
    (built,) = [p for p in folder.iterdir() if p.is_symlink() and "failed" not in p.name]
    report = json.loads((built / "generation_check.json").read_text())
    assert report["passed"]
    for seq in report["sequences"]:
        assert seq["exported"] == seq["reference"] and len(seq["reference"]) == 16
        assert 1e-6 < max(seq["max_diff_per_step"]) < seq["min_top2_gap"]  # float16 rounding

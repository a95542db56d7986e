"""task: text2text-generation: an encoder graph and a decoder graph per build, each
hierarchical, and a greedy decode through both in ONNX Runtime equal to transformers' generate.

The default run builds the BART zoo recipe on the TorchScript path; the rest of the seq2seq zoo
(T5, BART, Whisper, mBART on both paths) is ``zoo``-marked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.judge import MIN_STEPS
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import RECIPES_DIR, compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from hyperexport.zoo import seq2seq_zoo
from tests.helpers.release_skips import NEEDS_ENCODER_DECODER_TASKS

#: Each test builds or runs a decoding task.
pytestmark = NEEDS_ENCODER_DECODER_TASKS


def _build(tmp_path: Path, *overrides: str) -> Any:
    recipe, settings = compose_recipe(
        [
            *overrides,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )
    return run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))


def _names(values: Any) -> list[str]:
    return [v.name for v in values]


def _assert_seq2seq_build(tmp_path: Path, name: str, dynamo: bool) -> None:
    outcome = _build(tmp_path, f"recipe={name}", f"dynamo={str(dynamo).lower()}")
    assert outcome.exit_code == 0, outcome.result.error
    folder = outcome.out_dir
    report = outcome.report
    # Two graphs, both in the report's artifacts, both hierarchical.
    for graph in ("encoder", "decoder"):
        assert report["artifacts"][f"{graph}_model"] == str(folder / f"{graph}_model.onnx")
    # The check vouches for both graphs as published, by the digests its key covers.
    judged = json.loads((folder / "check.json").read_text())["judged"]
    for name in ("encoder_model.onnx", "decoder_model.onnx", "encoder_manifest.json"):
        assert judged[name] == report["files"][name]["digest"]
    encoder = onnx.load(str(folder / "encoder_model.onnx"), load_external_data=False)
    decoder = onnx.load(str(folder / "decoder_model.onnx"), load_external_data=False)
    enc_functions = {f.name for f in encoder.functions}
    dec_functions = {f.name for f in decoder.functions}
    assert any("EncoderLayer" in f or "T5Block" in f for f in enc_functions), enc_functions
    assert any(f.startswith("CrossKV") for f in enc_functions), enc_functions
    assert dec_functions and all(f.startswith("Seq2SeqKVStep") for f in dec_functions)
    if "T5Block" not in str(enc_functions):  # T5's first layer has the position bias table
        assert dec_functions == {"Seq2SeqKVStep"}  # per_type: identical layers, one function
    layers = 2
    # The KV are explicit: the encoder outputs each layer's cross KV, the decoder takes past and
    # cross KV and returns the present self KV; no cache object crosses a function.
    cross = [f"present.{i}.encoder.{k}" for i in range(layers) for k in ("key", "value")]
    assert _names(encoder.graph.output)[1:] == cross
    dec_inputs = _names(decoder.graph.input)
    for i in range(layers):
        for k in ("key", "value"):
            assert f"past_key_values.{i}.decoder.{k}" in dec_inputs
            assert f"past_key_values.{i}.encoder.{k}" in dec_inputs
    assert _names(decoder.graph.output) == ["logits"] + [
        f"present.{i}.decoder.{k}" for i in range(layers) for k in ("key", "value")
    ]
    # Per-function parity of each graph, under its graph's name.
    check = report["check"]
    assert check["ok"] and set(check["graphs"]) == {"encoder", "decoder"}
    assert {f["module_path"].split("/")[0] for f in check["functions"]} == {"encoder", "decoder"}
    assert all(f["ok"] for f in check["functions"])
    assert {f["graph"] for f in report["functions"]} == {"encoder", "decoder"}
    # The decode: token for token, long enough, varied, and decided by more than the error.
    decode = json.loads((folder / "seq2seq_check.json").read_text())
    assert decode["passed"]
    for seq in decode["sequences"]:
        assert seq["exported"] == seq["reference"]
        assert len(seq["reference"]) >= MIN_STEPS
        assert len(set(seq["reference"])) >= 3  # the tokens vary
        error = max(seq["max_diff_per_step"])
        assert 0.0 < error < seq["min_top2_gap"]  # measured, and smaller than every gap


def test_bart_exports_encoder_and_decoder_graphs_that_decode_as_transformers(
    tmp_path: Path,
) -> None:
    _assert_seq2seq_build(tmp_path, "zoo_bart", dynamo=False)


def test_the_seq2seq_zoo_covers_t5_bart_whisper_and_mbart() -> None:
    assert seq2seq_zoo(RECIPES_DIR) == ["zoo_bart", "zoo_mbart", "zoo_t5", "zoo_whisper"]


@pytest.mark.zoo
@pytest.mark.parametrize(
    ("name", "dynamo"),
    [
        (name, dynamo)
        for name in seq2seq_zoo(RECIPES_DIR)
        for dynamo in (False, True)
        if (name, dynamo) != ("zoo_bart", False)  # the default run's
    ],
)
def test_seq2seq_zoo_decodes_as_transformers(name: str, dynamo: bool, tmp_path: Path) -> None:
    _assert_seq2seq_build(tmp_path, name, dynamo)


def test_an_explicit_hiera_is_refused_when_the_recipe_is_validated() -> None:
    # A RecipeError is the command line's exit 2 (hyperexport/base/exit_codes.py INVALID).
    with pytest.raises(RecipeError, match=r"field 'hiera': .*set hiera: auto"):
        compose_recipe(["recipe=zoo_bart", "hiera=[torch.nn.Linear]"])


@pytest.mark.slow
def test_a_saved_checkpoint_with_task_auto_builds_both_graphs(tmp_path: Path) -> None:
    """``task: auto`` through ``hyperexport.models.pretrained``: the checkpoint's config.json
    (an encoder-decoder ``*ForConditionalGeneration``) makes it text2text-generation, with
    ``inputs``, ``hiera`` and ``dynamic`` auto too; the decode matches transformers."""
    import yaml

    from hyperexport.product.config import BuildSettings, validate_recipe
    from hyperexport.zoo import random_transformer

    zoo = yaml.safe_load((RECIPES_DIR / "zoo_bart.yaml").read_text())["model"]
    checkpoint = tmp_path / "bart"
    model = random_transformer(zoo["model_class"], zoo["config"], seed=zoo["seed"])
    model.save_pretrained(checkpoint)
    data = {
        "name": "bart_auto",
        "model": {
            "_target_": "hyperexport.models.pretrained",
            "path": str(checkpoint),
            "auto_class": "AutoModelForSeq2SeqLM",
            "attn_implementation": "eager",
        },
        "task": "auto",
        "inputs": "auto",
        "hiera": "auto",
        "dynamic": "auto",
        "dynamo": False,
        "functions": "per_type",
        "generation": {"prompts": [[17, 93, 41, 8, 120, 66, 5, 3]], "max_new_tokens": 10},
    }
    recipe = validate_recipe(data, str(tmp_path / "bart_auto.yaml"))
    assert recipe.data["task"] == "text2text-generation"
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "out", False, ())
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.result.error
    assert (outcome.out_dir / "encoder_model.onnx").is_file()
    assert (outcome.out_dir / "decoder_model.onnx").is_file()
    decode = json.loads((outcome.out_dir / "seq2seq_check.json").read_text())
    assert decode["passed"]
    for seq in decode["sequences"]:
        assert seq["exported"] == seq["reference"] and len(set(seq["reference"])) >= 3

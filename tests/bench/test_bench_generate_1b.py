"""bench/bench_generate_1b.py: its recipes compose and validate, the default one is unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hyperexport.product.config.hydra import compose_recipe
from tests.helpers.release_skips import NEEDS_DECODING_TASKS
from tests.helpers.scripts import load_script

# The recipe the script wrote before --fuse and --quantize (torchscript, 8 tokens).
BEFORE = (
    "# @package _global_\n"
    "name: bench_1b_generate_torchscript\n"
    "model: {_target_: hyperexport.models.pretrained, path: /c/ckpt,"
    " auto_class: AutoModelForCausalLM}\n"
    "inputs: auto\nhiera: auto\ntask: text-generation\nfunctions: per_type\nexternal_data: true\n"
    "dynamo: false\n"
    "generation: {prompts: [[17, 93, 41, 8, 120, 66, 5], [71, 30, 99, 12]], max_new_tokens: 8}\n"
)


def _load() -> ModuleType:
    return load_script("bench/bench_generate_1b.py")


def _options(bench: ModuleType, *argv: str) -> Any:
    return bench.recipe_options(bench.parse_args(["out", *argv]))


def test_without_options_the_recipe_is_what_it_was() -> None:
    bench = _load()
    options = _options(bench)
    assert options.tag == "torchscript"
    assert bench.recipe_text("bench_1b_generate_torchscript", Path("/c/ckpt"), options) == BEFORE


@NEEDS_DECODING_TASKS  # the recipe is a text-generation one, which validation checks
def test_fused_int4_recipe_validates_with_its_fields(tmp_path: Path) -> None:
    bench = _load()
    argv = ("--fuse", "onnxruntime", "--quantize", "int4_block", "--block-size", "64")
    options = _options(bench, *argv, "--accuracy-level", "1")
    recipe = tmp_path / f"bench_1b_generate_{options.tag}.yaml"
    bench.write_recipe(recipe, tmp_path / "ckpt", options)

    composed, _ = compose_recipe([], recipe_file=recipe)

    data = composed.data
    assert composed.name == "bench_1b_generate_torchscript_fused_int4"
    assert data["attention"]["implementation"] == "hyperexport"
    assert data["rewrite"]["fuse"] == "onnxruntime"
    quantize = data["quantize"]
    assert (quantize["method"], quantize["block_size"], quantize["accuracy_level"]) == (
        "int4_block",
        64,
        1,
    )
    quantized = data["check"]["quantized"]
    assert quantized["decode"] == "report"
    assert (quantized["min_cosine"], quantized["min_top1"]) == (0.0, 0.0)
    assert quantized["max_rel_error"] >= 1e6
    assert data["task"] == "text-generation" and data["external_data"] is True


def test_an_unknown_fuse_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    with pytest.raises(SystemExit) as refused:
        bench.parse_args(["out", "--fuse", "standard"])
    assert refused.value.code == 2
    assert "invalid choice: 'standard'" in capsys.readouterr().err


def test_the_builder_gets_our_int4_layout_at_int4_only() -> None:
    """Block size, accuracy level and symmetry as our recipe has them (the builder's own
    default is symmetric: without ``--symmetric`` it is told otherwise)."""
    bench = _load()
    options = _options(bench, "--block-size", "64", "--accuracy-level", "2")
    int4 = bench.builder_command(Path("/c/ckpt"), Path("/o"), "int4", options)
    assert int4[int4.index("-i") + 1] == "/c/ckpt" and int4[int4.index("-p") + 1] == "int4"
    assert int4[int4.index("-e") + 1] == "cpu"
    extra = ["--extra_options", "block_size=64", "accuracy_level=2", "is_symmetric=false"]
    assert int4[-4:] == extra
    symmetric = _options(bench, "--quantize", "int4_block", "--symmetric")
    assert "symmetric: true" in bench.recipe_text("r", Path("/c/ckpt"), symmetric)
    shared = _options(bench, "--quantize", "int4_block", "--symmetric", "--shared-embedding")
    assert "shared_embedding: true" in bench.recipe_text("r", Path("/c/ckpt"), shared)
    assert "shared_embedding: false" in bench.recipe_text("r", Path("/c/ckpt"), symmetric)
    assert (
        bench.builder_command(Path("/c"), Path("/o"), "int4", symmetric)[-1] == "is_symmetric=true"
    )
    fp32 = bench.builder_command(Path("/c/ckpt"), Path("/o"), "fp32", options)
    assert "--extra_options" not in fp32 and fp32[fp32.index("-p") + 1] == "fp32"


def test_startup_to_the_model_leaves_out_evaluate_and_check() -> None:
    bench = _load()
    stages = {"trace": 10.0, "quantize": 5.0, "evaluate": 30.0, "check": 2.0}
    assert bench.startup_to_model(50.0, stages) == 18.0


def test_the_verification_before_the_model_is_the_reference_decode_span(tmp_path: Path) -> None:
    bench = _load()
    report = tmp_path / "report.json"
    assert bench.verification_before_model(report) == 0.0  # no report: nothing to subtract
    stages = [
        {"name": "trace", "seconds": 20.0, "spans": {"reference decode": 8.5, "other": 1.0}},
        {"name": "quantize", "seconds": 5.0},
        {"name": "evaluate", "seconds": 30.0, "spans": {"reference decode": 4.0}},
    ]
    report.write_text(json.dumps({"stages": stages}))
    assert bench.verification_before_model(report) == 8.5  # not evaluate's, not other spans
    ours = {"startup_to_model_s": 60.0, "unverified_to_model_s": 51.0}
    assert bench.ratios(ours, {"int4": {"wall_s": 42.5}}, quantized=True) == {
        "startup_to_model_over_builder_int4": round(60 / 42.5, 3),
        "unverified_to_model_over_builder_int4": 1.2,
    }


def test_a_checkpoint_is_kept_only_when_every_file_it_names_is_there(tmp_path: Path) -> None:
    import json

    bench = _load()
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    assert not bench.checkpoint_complete(tmp_path)  # a save that died before the weights
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert bench.checkpoint_complete(tmp_path)
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    (tmp_path / shards["a"]).write_bytes(b"")
    assert not bench.checkpoint_complete(tmp_path)  # sharded, one shard missing
    (tmp_path / shards["b"]).write_bytes(b"")
    assert bench.checkpoint_complete(tmp_path)


def test_rounds_and_dropping_the_page_cache_are_refused_where_they_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load()
    with pytest.raises(SystemExit):
        bench.parse_args(["out", "--rounds", "0"])
    assert "--rounds: at least 1" in capsys.readouterr().err
    monkeypatch.setattr(bench, "DROP_CACHES", tmp_path / "absent" / "drop_caches")
    with pytest.raises(SystemExit):
        bench.parse_args(["out", "--drop-caches"])
    assert "--drop-caches:" in capsys.readouterr().err
    assert bench.parse_args(["out", "--rounds", "3"]).rounds == 3


def test_settling_with_the_page_cache_dropped_reads_the_checkpoint_back_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``settle`` writes 1 to the drop_caches file (here a stand-in) and reads every
    safetensors file of the checkpoint to its end."""
    bench = _load()
    drop = tmp_path / "drop_caches"
    monkeypatch.setattr(bench, "DROP_CACHES", drop)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"x" * 100)
    read: list[str] = []
    real_open = open

    def spy(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(".safetensors"):
            read.append(Path(path).name)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spy)
    bench.settle(ckpt, drop_caches=False)
    assert not drop.exists() and read == []
    bench.settle(ckpt, drop_caches=True)
    assert drop.read_text() == "1\n" and read == ["model.safetensors"]

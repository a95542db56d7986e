"""``hyperexport.models.pretrained``: checkpoints by path, through the stage runner; bad input
exits 2 with one line naming the recipe field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import exit_codes
from hyperexport.base.errors import RecipeError
from hyperexport.library.models import pretrained
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import BuildSettings, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader

REPO = Path(__file__).resolve().parents[3]


def _recipe(path: Path | str, **model: Any) -> dict[str, Any]:
    return {
        "name": "ckpt",
        "model": {"_target_": "hyperexport.models.pretrained", "path": str(path), **model},
        "inputs": "auto",
        "hiera": "auto",
        "dynamo": False,
    }


def test_a_saved_checkpoint_builds_with_auto_hiera_and_inputs(
    llama_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyperexport.library.models import auto as auto_module

    resolved: list[int] = []
    resolve = auto_module.resolve_auto
    monkeypatch.setattr(
        auto_module, "resolve_auto", lambda *a, **k: resolved.append(1) or resolve(*a, **k)
    )
    data = _recipe(llama_checkpoint, auto_class="AutoModelForCausalLM")
    recipe = validate_recipe(data, str(tmp_path / "ckpt.yaml"))
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "out", False, ())
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.result.error
    assert resolved == [1]  # auto resolved once, by the trace; export reads capture_spec.json
    again = BuildSettings(str(tmp_path / "cache"), tmp_path / "out2", False, ("export",))
    rerun = run_build(recipe, again, stages=PIPELINE, load_model=model_loader(recipe))
    assert [(s.name, s.status) for s in rerun.result.stages][:2] == [
        ("trace", "hit"),
        ("export", "ran"),
    ]
    assert resolved == [1] and rerun.model_path is not None and outcome.model_path is not None
    assert rerun.model_path.read_bytes() == outcome.model_path.read_bytes()
    report = outcome.report
    assert report is not None and report["check"]["ok"]
    logits = report["check"]["end_to_end"]["outputs"][0]
    assert logits["name"] == "logits" and logits["max_abs"] <= 1e-4
    auto = json.loads((outcome.out_dir / "auto.json").read_text())
    assert [h.rsplit(".", 1)[-1] for h in auto["hiera"]] == ["LlamaDecoderLayer"]
    assert "auto.json" in report["files"]
    assert {f["class"].rsplit(".", 1)[-1] for f in report["functions"]} == {"LlamaDecoderLayer"}


def test_dtype_and_class_are_applied(llama_checkpoint: Path) -> None:
    import torch

    model = pretrained(str(llama_checkpoint), auto_class="AutoModel", dtype="bfloat16")
    assert type(model).__name__ == "LlamaModel" and not model.training
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config.use_cache is False


def _error(path: str, **model: Any) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        pretrained(path, **model)
    assert "\n" not in str(info.value)
    return info.value


def test_bad_checkpoints_name_the_field(llama_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert _error(str(tmp_path / "empty")).field == "model.path"
    weights = next(llama_checkpoint.glob("*.safetensors"))
    assert "not a checkpoint directory" in _error(str(weights)).reason
    assert "does not exist" in _error(str(tmp_path / "nowhere")).reason
    no_type = tmp_path / "no_type"
    no_type.mkdir()
    (no_type / "config.json").write_text(json.dumps({"hidden_size": 8}))
    error = _error(str(no_type))
    assert error.field == "model.path" and "model_type" in error.reason
    mismatch = _error(str(llama_checkpoint), auto_class="AutoModelForImageClassification")
    assert mismatch.field == "model.auto_class" and "does not fit" in mismatch.reason
    # issue 34: a Whisper checkpoint under AutoModelForSeq2SeqLM; the line names what fits
    fits = mismatch.reason.split("; auto classes that fit: ")[1].split(", ")
    assert "AutoModelForCausalLM" in fits and "AutoModelForImageClassification" not in fits
    assert (
        _error(str(llama_checkpoint), auto_class="AutoModelForCasualLM").field == "model.auto_class"
    )
    assert _error(str(llama_checkpoint), revision="main").field == "model.revision"


def test_remote_code_is_refused_unless_the_recipe_allows_it(
    llama_checkpoint: Path, tmp_path: Path
) -> None:
    import shutil

    remote = tmp_path / "remote"
    shutil.copytree(llama_checkpoint, remote)
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (remote / "config.json").write_text(json.dumps(config))
    error = _error(str(remote))
    assert error.field == "model.trust_remote_code" and "auto_map" in error.reason


def _cli(recipe: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    from omegaconf import OmegaConf

    file = tmp_path / f"{recipe['name']}.yaml"
    OmegaConf.save(OmegaConf.create(recipe), file)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperexport",
            f"recipe_file={file}",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_cli_exits_2_with_one_line_naming_the_field(llama_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "notackpt").mkdir()
    result = _cli(_recipe(tmp_path / "notackpt"), tmp_path)
    assert result.returncode == exit_codes.INVALID, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "field 'model.path'" in line]
    assert errors and all("no config.json" in line for line in errors), result.stderr[-2000:]


def test_hiera_auto_on_a_model_without_blocks_is_refused_naming_the_field() -> None:
    """A plain module, explicit inputs: the same RecipeError the command line prints in one line
    with exit 2 (the test above)."""
    import torch

    from hyperexport.library.models.auto import resolve_auto
    from hyperexport.product.config.fields import to_json
    from hyperexport.product.config.schema import InputSpec

    with pytest.raises(RecipeError) as info:
        resolve_auto(
            {"inputs": {"input": to_json(InputSpec(shape=[2, 4]))}, "hiera": "auto"},
            torch.nn.Linear(4, 2),
            "/r/noblocks.yaml",
        )
    assert info.value.field == "hiera" and "no repeated blocks" in info.value.reason
    assert "field 'hiera'" in str(info.value) and "\n" not in str(info.value)


def test_replacing_the_weights_reruns_the_stages_that_read_them(
    llama_checkpoint: Path, tmp_path: Path
) -> None:
    import shutil

    from hyperexport.zoo import tiny_llama

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint, checkpoint)
    data = _recipe(checkpoint, auto_class="AutoModelForCausalLM")
    recipe = validate_recipe(data, str(tmp_path / "ckpt.yaml"))
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "out", False, ())

    def build() -> dict[str, Any]:
        outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
        assert outcome.exit_code == 0, outcome.result.error
        assert outcome.report is not None
        return {s["name"]: s for s in outcome.report["stages"]}

    build()
    assert {s["status"] for s in build().values()} == {"hit"}
    tiny_llama(num_layers=2, causal_lm=True, seed=4).save_pretrained(checkpoint)  # new weights
    stages = build()
    assert stages["trace"]["status"] == "ran" and "model.path" in stages["trace"]["reason"]
    assert stages["export"]["status"] == "ran"


def test_a_hub_id_is_loaded_at_the_pinned_revision(
    llama_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No network here: the auto class's loader is replaced by one that records its arguments
    and loads the local checkpoint instead."""
    import transformers

    seen: dict[str, Any] = {}
    real = transformers.AutoModel.from_pretrained

    def record(name: str, **kwargs: Any) -> Any:
        seen.update(kwargs, name=name)
        return real(str(llama_checkpoint), local_files_only=True)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", record)
    model = pretrained("someorg/tiny-llama", revision="0123abc")
    assert seen["name"] == "someorg/tiny-llama" and seen["revision"] == "0123abc"
    assert seen["trust_remote_code"] is False and "local_files_only" not in seen
    assert not model.training

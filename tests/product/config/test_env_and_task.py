"""``env`` (the environment variables the model reads, keyed as digests) and ``task``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.engine.hashing import FileDigestIndex
from hyperexport.engine.keys import explain
from hyperexport.product.builds.session import model_fingerprint
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.schema import stage_reads
from tests.helpers.release_skips import NEEDS_ENCODER_DECODER_TASKS

BASE = {
    "name": "t",
    "model": {"_target_": "hyperexport.zoo.tiny_llama"},
    "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64", "low": 0, "high": 128}},
    "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
    "dynamo": False,
}


def test_env_default_and_readers() -> None:
    recipe = validate_recipe(BASE, "/r/t.yaml")
    assert recipe.data["env"] == []
    for stage in ("trace", "export"):
        assert "env" in stage_reads(stage), stage
    for stage in ("rewrite", "evaluate", "check"):
        assert "env" not in stage_reads(stage), stage


def test_env_values_enter_the_model_fingerprint_as_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = validate_recipe({**BASE, "env": ["HX_TEST_FLAG"]}, "/r/t.yaml")
    index = FileDigestIndex(tmp_path / "index.json")
    monkeypatch.delenv("HX_TEST_FLAG", raising=False)
    unset = model_fingerprint(recipe, index)
    assert unset["env"] == {"HX_TEST_FLAG": None}
    monkeypatch.setenv("HX_TEST_FLAG", "secret-value-1")
    first = model_fingerprint(recipe, index)
    monkeypatch.setenv("HX_TEST_FLAG", "secret-value-2")
    second = model_fingerprint(recipe, index)
    assert first["env"] != second["env"] and first["env"] != unset["env"]
    assert "secret-value" not in repr(first) + repr(second)  # a digest, never the value
    reason = explain({"model": first}, {"model": second})
    assert "env HX_TEST_FLAG changed" in reason
    # A recipe without env keeps its fingerprint free of it.
    assert "env" not in model_fingerprint(validate_recipe(BASE, "/r/t.yaml"), index)


def test_task_default_readers_and_implemented_set() -> None:
    from hyperexport.product.config.schema import IMPLEMENTED_TASKS, TASKS

    assert validate_recipe(BASE, "/r/t.yaml").data["task"] == "forward"
    assert all("task" in stage_reads(s) for s in ("trace", "export"))
    assert set(IMPLEMENTED_TASKS) <= set(TASKS)


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "GITHUB_TOKEN",
        "aws_secret_access_key",
        "CLIENT_SECRET",
        "DB_PASSWORD",
        "API_KEY",
        "HFTOKEN",
        "MY_TOKENS",
    ],
)
def test_a_name_that_looks_like_a_secret_is_refused(name: str) -> None:
    """A digest of a short secret can be checked against guesses, and a key shared through a
    remote cache shows when the value changed: such names are refused (issue 32)."""
    from hyperexport.base.errors import RecipeError

    with pytest.raises(RecipeError) as info:
        validate_recipe({**BASE, "env": ["HF_HOME", name]}, "/r/t.yaml")
    assert info.value.field == "env[1]"
    assert "looks like a secret" in info.value.reason and "guesses" in info.value.reason


def test_names_that_only_resemble_a_secret_pattern_pass() -> None:
    names = [
        "HF_HOME",
        "MY_MODEL_FLAG",
        "KEYBOARD_LAYOUT",
        "MONKEY",
        "KEY",
        "TOKENIZERS_PARALLELISM",
    ]
    assert validate_recipe({**BASE, "env": names}, "/r/t.yaml").data["env"] == names


@NEEDS_ENCODER_DECODER_TASKS  # checked once the task is (refused before 4.57, and 5.0 to 5.8)
def test_a_quantized_encoder_decoder_is_refused_before_it_builds() -> None:
    """Its two graphs have no single model.onnx to quantize: the quantize stage failed with a
    FileNotFoundError after the export (found by the issue-32 review)."""
    from hyperexport.base.errors import RecipeError

    recipe = {
        **BASE,
        "task": "text2text-generation",
        "hiera": "auto",
        "generation": {"prompts": [[1, 2, 3]]},
        "quantize": {"method": "int4_block"},
    }
    with pytest.raises(RecipeError) as info:
        validate_recipe(recipe, "/r/t.yaml")
    assert info.value.field == "quantize.method"
    assert "quantize.method: none" in info.value.reason

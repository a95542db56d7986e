"""``task: auto``: the task is read from the checkpoint's ``config.json`` at validation (data
only), replaces ``auto`` in the validated recipe, and is refused in one line without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import versions
from hyperexport.base.errors import RecipeError
from hyperexport.product.config import validate_recipe
from hyperexport.product.config.task_inference import task_of


def _config(name: str, **kwargs: Any) -> dict[str, Any]:
    """A real transformers config of class ``name``, as its config.json holds it."""
    import transformers

    return getattr(transformers, name)(**kwargs).to_dict()


@pytest.mark.parametrize(
    ("config_class", "architecture", "task"),
    [
        ("LlamaConfig", "LlamaForCausalLM", "text-generation"),
        ("GPT2Config", "GPT2LMHeadModel", "text-generation"),
        ("T5Config", "T5ForConditionalGeneration", "text2text-generation"),
        ("BartConfig", "BartForConditionalGeneration", "text2text-generation"),
        ("MarianConfig", "MarianMTModel", "text2text-generation"),
        ("WhisperConfig", "WhisperForConditionalGeneration", "automatic-speech-recognition"),
        ("BertConfig", "BertModel", "forward"),
        ("ViTConfig", "ViTForImageClassification", "forward"),
        ("T5Config", "T5EncoderModel", "forward"),
        ("LlavaConfig", "LlavaForConditionalGeneration", "forward"),  # not an encoder-decoder
    ],
)
def test_the_task_follows_the_declared_architecture(
    config_class: str, architecture: str, task: str
) -> None:
    config = _config(config_class)
    config["architectures"] = [architecture]
    assert task_of(config) == task


def test_a_config_without_architectures_is_a_forward_export() -> None:
    assert task_of(_config("LlamaConfig")) == "forward"


RECIPE = {
    "name": "t",
    "inputs": "auto",
    "hiera": "auto",
    "dynamo": False,
    "task": "auto",
    "generation": {"prompts": [[1, 2, 3]]},
}


def test_auto_is_resolved_into_the_validated_recipe(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = _config("BartConfig")
    config["architectures"] = ["BartForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(config))
    model = {"_target_": "hyperexport.models.pretrained", "path": "ckpt"}
    if missing := versions.decoding_task_missing("text2text-generation"):
        # resolved, then refused by name on a transformers before 4.57
        with pytest.raises(RecipeError) as refused:
            validate_recipe({**RECIPE, "model": model}, str(tmp_path / "r.yaml"))
        assert (refused.value.field, refused.value.reason) == ("task", missing)
        return
    recipe = validate_recipe({**RECIPE, "model": model}, str(tmp_path / "r.yaml"))
    assert recipe.data["task"] == "text2text-generation"  # beside the recipe file
    assert recipe.config.task == "text2text-generation"


def test_auto_without_a_checkpoint_names_the_field(tmp_path: Path) -> None:
    model = {"_target_": "hyperexport.zoo.tiny_llama"}
    with pytest.raises(RecipeError) as e:
        validate_recipe({**RECIPE, "model": model}, str(tmp_path / "r.yaml"))
    assert e.value.field == "task"
    assert "set task explicitly" in str(e.value) and "\n" not in str(e.value)

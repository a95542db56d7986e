"""genai_config.json from a checkpoint config (data in, JSON out), and its refusals."""

from __future__ import annotations

import pytest

from hyperexport.errors import RecipeError
from hyperexport.generation.genai_config import GENAI_MODEL_TYPES, build_genai_config

LLAMA = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "max_position_embeddings": 96,
    "bos_token_id": 1,
    "eos_token_id": [2, 5],
    "pad_token_id": None,
}


def test_the_config_names_the_shapes_tokens_and_io_of_the_export() -> None:
    genai = build_genai_config(LLAMA, model_file="model.onnx")
    model, decoder = genai["model"], genai["model"]["decoder"]
    assert model["type"] == "llama" and model["context_length"] == 96
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (1, [2, 5], 2)
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"]) == (4, 2)
    assert (decoder["head_size"], decoder["num_hidden_layers"]) == (16, 3)
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert genai["search"]["past_present_share_buffer"] is False
    assert genai["search"]["max_length"] == 96 and genai["search"]["do_sample"] is False


def test_an_explicit_head_dim_wins_over_hidden_by_heads() -> None:
    genai = build_genai_config({**LLAMA, "model_type": "qwen3", "head_dim": 32}, model_file="m")
    assert genai["model"]["decoder"]["head_size"] == 32
    assert genai["model"]["type"] == GENAI_MODEL_TYPES["qwen3"]


def test_a_model_type_onnxruntime_genai_does_not_know_is_refused_naming_it() -> None:
    with pytest.raises(RecipeError, match="'gpt_bigcode'") as info:
        build_genai_config({**LLAMA, "model_type": "gpt_bigcode"}, model_file="m", recipe_file="r")
    assert info.value.field == "task"

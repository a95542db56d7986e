"""genai_config.json from a checkpoint config (data in, JSON out), and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.causal_lm import shares_kv_buffer
from hyperexport.library.tasks.genai_config import (
    GENAI_MODEL_TYPES,
    GENAI_SOURCE_KEYS,
    SHARE_BUFFER,
    build_genai_config,
    genai_config_problems,
    genai_source,
    recorded_context_length,
)
from hyperexport.library.tasks.registry import GENAI_CONFIG
from hyperexport.library.tasks.registry import GENERATION_REFERENCE_JSON as REFERENCE_JSON
from tests.helpers.release_skips import NEEDS_QWEN3

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


def test_a_shared_kv_buffer_is_said_and_recorded_with_the_models_keys() -> None:
    """The trace sets it (rewrite.fuse: onnxruntime over attention nodes); the recorded
    source keeps it, so the quantize stage's config and the check's rebuilt one say it too;
    absent, the config is what it was."""
    shared = {**LLAMA, SHARE_BUFFER: True}
    genai = build_genai_config(shared, model_file="model.onnx")
    assert genai["search"]["past_present_share_buffer"] is True
    assert genai["search"]["max_length"] == genai["model"]["context_length"] == 96
    assert genai_source(shared)[SHARE_BUFFER] is True and SHARE_BUFFER not in genai_source(LLAMA)
    assert build_genai_config(genai_source(shared), model_file="model.onnx") == genai
    assert shares_kv_buffer(
        {"rewrite": {"fuse": "onnxruntime"}, "attention": {"implementation": "hyperexport"}}
    )
    assert not shares_kv_buffer({"rewrite": {"fuse": "onnxruntime"}, "attention": {}})
    assert not shares_kv_buffer(
        {"rewrite": {"fuse": "standard"}, "attention": {"implementation": "hyperexport"}}
    )


def test_an_explicit_head_dim_wins_over_hidden_by_heads() -> None:
    genai = build_genai_config({**LLAMA, "model_type": "qwen3", "head_dim": 32}, model_file="m")
    assert genai["model"]["decoder"]["head_size"] == 32
    assert genai["model"]["type"] == GENAI_MODEL_TYPES["qwen3"]


def test_a_model_type_onnxruntime_genai_does_not_know_is_refused_naming_it() -> None:
    with pytest.raises(RecipeError, match="'gpt_bigcode'") as info:
        build_genai_config({**LLAMA, "model_type": "gpt_bigcode"}, model_file="m", recipe_file="r")
    assert info.value.field == "task"


@NEEDS_QWEN3  # builds a Qwen3Config
def test_the_recorded_source_keys_build_the_same_config_as_the_whole_config() -> None:
    """The trace records only :data:`GENAI_SOURCE_KEYS` for the check to build the file again:
    every key the builder reads must be among them."""
    from transformers import LlamaConfig, Qwen3Config

    for config in (LlamaConfig(num_key_value_heads=2), Qwen3Config(head_dim=32)):
        data = json.loads(config.to_json_string())
        assert build_genai_config(genai_source(data), model_file="m") == build_genai_config(
            data, model_file="m"
        )
    assert set(genai_source({**LLAMA, "rope_theta": 1e4})) == set(LLAMA) & set(GENAI_SOURCE_KEYS)


def _trace_dir(tmp_path: Path, genai: dict[str, object], config: object) -> Path:
    (tmp_path / GENAI_CONFIG).write_text(json.dumps(genai))
    (tmp_path / REFERENCE_JSON).write_text(json.dumps({"config": config}))
    return tmp_path


def test_the_published_genai_config_is_judged_against_the_models_config(tmp_path: Path) -> None:
    genai = build_genai_config(LLAMA, model_file="model.onnx")
    assert genai_config_problems(_trace_dir(tmp_path, genai, LLAMA)) == []
    genai["model"]["context_length"] = 4096  # a decode of a few tokens never reaches it
    genai["search"]["top_k"] = 50
    assert genai_config_problems(_trace_dir(tmp_path, genai, LLAMA)) == [
        "genai_config.json: model.context_length is 4096, the model's config gives 96",
        "genai_config.json: search.top_k is 50, the model's config gives 1",
    ]
    del genai["model"]["decoder"]
    genai["extra"] = True
    problems = genai_config_problems(_trace_dir(tmp_path, genai, LLAMA))
    assert problems[0] == "genai_config.json: extra is true, the model's config gives absent"
    assert problems[-1] == "genai_config.json: +1 more fields"  # decoder, absent
    assert genai_config_problems(_trace_dir(tmp_path, genai, None)) == [
        "generation_reference.json records no model config to judge genai_config.json against"
    ]


def test_the_quantize_stages_config_is_judged_in_place_of_the_traces(tmp_path: Path) -> None:
    """Quantized, the published genai_config.json is the quantize stage's: it must name
    model.quantized.onnx, and is what the check judges (the trace's float one is not published)."""
    from hyperexport.library.tasks.genai_config import write_quantized_genai_config

    trace = _trace_dir(tmp_path, build_genai_config(LLAMA, model_file="model.onnx"), LLAMA)
    quantize = tmp_path / "quantize"
    quantize.mkdir()
    assert genai_config_problems(trace, quantize) == []  # nothing written: the trace's is judged
    write_quantized_genai_config(trace, quantize)
    written = json.loads((quantize / GENAI_CONFIG).read_text())
    assert written["model"]["decoder"]["filename"] == "model.quantized.onnx"
    assert genai_config_problems(trace, quantize) == []
    written["model"]["decoder"]["filename"] = "model.onnx"  # would run the float model
    (quantize / GENAI_CONFIG).write_text(json.dumps(written))
    assert genai_config_problems(trace, quantize) == [
        'genai_config.json: model.decoder.filename is "model.onnx", the model\'s config gives '
        '"model.quantized.onnx"'
    ]


def test_the_rewrite_reads_the_recorded_context_length_and_none_without_a_reference(
    tmp_path: Path,
) -> None:
    """The rewrite stage's ``ExportOptions.context_length`` (``passes/rotary_tables.py``): the
    recorded model config's, 0 for a trace of another task (no reference) or none recorded."""
    genai = build_genai_config(LLAMA, model_file="model.onnx")
    assert recorded_context_length(_trace_dir(tmp_path, genai, LLAMA)) == 96
    assert recorded_context_length(_trace_dir(tmp_path, genai, None)) == 0
    assert recorded_context_length(tmp_path / "empty") == 0

"""recipes/zoo_*_generate.yaml: each builds on both export paths, and the published folder is what
onnxruntime-genai loads and decodes token for token as transformers' greedy ``generate``.

The Llama recipe on the TorchScript path runs by default; the rest with ``-m zoo``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.engine.store import CacheStore
from hyperexport.library.tasks.judge import MIN_DISTINCT
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import RECIPES_DIR, compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.release_skips import NEEDS_DECODING_TASKS, NEEDS_GQA_QUERY_SEQLENS

#: Each test builds or runs a decoding task.
pytestmark = NEEDS_DECODING_TASKS

GENERATE = sorted(p.stem for p in RECIPES_DIR.glob("zoo_*_generate.yaml"))
FAST = {("zoo_llama_generate", False)}


def _cases() -> list[Any]:
    return [
        pytest.param(
            name,
            dynamo,
            marks=[] if (name, dynamo) in FAST else [pytest.mark.zoo],
            id=f"{name}-dynamo={dynamo}",
        )
        for name in GENERATE
        for dynamo in (False, True)
    ]


def _build(tmp_path: Path, *overrides: str) -> Any:
    recipe, settings = compose_recipe(
        [
            *overrides,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )
    return recipe, run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))


def test_the_generation_recipes_cover_the_families() -> None:
    families = {"llama", "qwen3", "mistral", "phi3", "gemma2"}
    assert {f"zoo_{f}_generate" for f in families} <= set(GENERATE)


@pytest.mark.parametrize(("name", "dynamo"), _cases())
def test_generation_recipe_decodes_in_onnxruntime_genai_as_transformers(
    name: str, dynamo: bool, tmp_path: Path
) -> None:
    recipe, outcome = _build(tmp_path, f"recipe={name}", f"dynamo={str(dynamo).lower()}")
    assert outcome.exit_code == 0, outcome.result.error
    folder = tmp_path / "out" / name / "default"
    report = json.loads((folder / "generation_check.json").read_text())
    assert report["passed"] and report["runtime"] == "onnxruntime-genai"
    prompts = recipe.data["generation"]["prompts"]
    steps = recipe.data["generation"]["max_new_tokens"]
    assert len(report["sequences"]) == 2 * len(prompts)  # each prompt alone, and the padded batch
    for seq in report["sequences"]:
        assert seq["exported"] == seq["reference"] and len(seq["reference"]) == steps
        assert len(set(seq["reference"])) >= MIN_DISTINCT
        assert seq["min_top2_gap"] > max(seq["max_diff_per_step"])

    # The model: onnxruntime-genai's names, dynamic batch/sequence/past, layers as functions.
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    layers = config["decoder"]["num_hidden_layers"]
    kv = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    assert [i.name for i in model.graph.input] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *kv,
    ]
    present = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    assert [o.name for o in model.graph.output] == ["logits", *present]
    past = model.graph.input[3].type.tensor_type.shape.dim
    assert past[0].dim_param and past[2].dim_param and not past[2].dim_value
    steps_fns = [f for f in model.functions if f.name.startswith("KVStep")]
    assert steps_fns and all(
        {"past_key", "past_value"} <= set(f.input) and len(f.output) == 3 for f in steps_fns
    )
    calls = [n for n in model.graph.node if n.op_type.startswith("KVStep")]
    assert len(calls) == layers
    if name != "zoo_gemma2_generate":  # per_type: identical layers share one function
        assert [f.name for f in model.functions] == ["KVStep"]

    # What a user runs on the folder: the three lines of the README.
    import onnxruntime_genai as og

    genai = og.Model(str(folder))
    params = og.GeneratorParams(genai)
    params.set_search_options(max_length=len(prompts[0]) + steps, do_sample=False)
    generator = og.Generator(genai, params)
    generator.append_tokens(np.asarray([prompts[0]], dtype=np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    assert list(generator.get_sequence(0))[len(prompts[0]) :] == report["sequences"][0]["reference"]


@pytest.mark.zoo
@NEEDS_GQA_QUERY_SEQLENS
@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", GENERATE)
def test_generation_recipe_fused_for_onnxruntime_and_int4_decodes_as_transformers(
    name: str, dynamo: bool, tmp_path: Path
) -> None:
    """Issue 35's "done when": each generate recipe builds with the ONNX Runtime fusion and
    int4 on both paths, its float model decodes token for token as transformers (the check)
    with the layers' attention one GroupQueryAttention, and the quantized one is published.
    Qwen3's per-head norm and Phi-3's packed projection once hid the head counts from the
    TorchScript path's fusion (``fuse_attention._heads``)."""
    _, outcome = _build(
        tmp_path,
        f"recipe={name}",
        f"dynamo={str(dynamo).lower()}",
        "attention.implementation=hyperexport",
        "rewrite.fuse=onnxruntime",
        "quantize.method=int4_block",
    )
    assert outcome.exit_code == 0, outcome.result.error
    folder = outcome.out_dir
    report = json.loads((folder / "generation_check.json").read_text())
    assert report["passed"]
    assert all(seq["exported"] == seq["reference"] for seq in report["sequences"])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert all(
        f["fused_ops"].get("com.microsoft::GroupQueryAttention") == 1 for f in manifest["functions"]
    )
    genai = json.loads((folder / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "model.quantized.onnx"
    assert (folder / "model.quantized.onnx").is_file() and (folder / "model.onnx").is_file()
    # The attention rotates by constant tables read at position_ids (passes/rotary_tables.py),
    # but in Phi-3, whose rotary the fusion leaves unfused (its slices of the packed projection).
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    tables = name != "zoo_phi3_generate"
    assert all(("position_ids" in f.input) is tables for f in model.functions)
    assert all(not {"cos", "sin"} & set(f.input) for f in model.functions) is tables


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["generation.max_new_tokens=200"], "generation.prompts[0]"),
        (["model.model_class=LlamaModel"], "model"),
        (["model.model_class=OlmoForCausalLM"], "task"),
    ],
    ids=["prompt-longer-than-context", "not-a-causal-lm", "unknown-genai-type"],
)
def test_refusals_are_exit_2_naming_the_field(
    overrides: list[str], field: str, tmp_path: Path
) -> None:
    _, outcome = _build(tmp_path, "recipe=zoo_llama_generate", *overrides)
    # The command turns a stage failure caused by a RecipeError into exit 2 (cli/build.py).
    cause = outcome.result.error.__cause__
    assert isinstance(cause, RecipeError) and cause.field == field, outcome.result.error
    assert "\n" not in str(cause)


def _replace_output(store: CacheStore, key: str, path: str, data: bytes) -> None:
    """Entry ``key`` with output ``path`` holding ``data``: a new blob under its true digest and
    the entry pointing at it, as a writer of the shared cache could make it."""
    digest = hashlib.sha256(data).hexdigest()
    store.blob_path(digest).parent.mkdir(parents=True, exist_ok=True)
    store.blob_path(digest).write_bytes(data)
    record = json.loads(store.action_path(key).read_text())
    record["outputs"] = [
        [p, digest, len(data)] if p == path else [p, d, s] for p, d, s in record["outputs"]
    ]
    store.action_path(key).write_text(json.dumps(record))


def test_a_tampered_genai_config_in_the_cache_is_judged_and_not_published(tmp_path: Path) -> None:
    """Issue 32: a trace entry whose genai_config.json had another context_length (digests
    made consistent) was served and published with rc 0: the decode of a few tokens never
    reaches the context length. The check builds the file again from the model config the
    reference decode ran with, and names the field."""
    _, first = _build(tmp_path, "recipe=zoo_llama_generate")
    assert first.exit_code == 0, first.result.error
    store = CacheStore(tmp_path / "cache")
    trace = first.result.entries["trace"]
    genai = json.loads(store.read_text(trace, "genai_config.json") or "")
    context = genai["model"]["context_length"]
    genai["model"]["context_length"] = context * 64
    _replace_output(store, trace.key, "genai_config.json", json.dumps(genai).encode())

    _, outcome = _build(tmp_path, "recipe=zoo_llama_generate")
    assert outcome.result.stages[0].status == "hit"  # the tampered entry was served
    assert outcome.exit_code == 1 and outcome.result.error is not None
    assert outcome.result.error.stage == "check"
    assert (
        f"genai_config.json: model.context_length is {context * 64}, the model's config gives "
        f"{context}" in str(outcome.result.error)
    )
    published = json.loads(
        (tmp_path / "out" / "zoo_llama_generate" / "default" / "genai_config.json").read_text()
    )
    assert published["model"]["context_length"] == context  # the good build's stays
    check = json.loads((outcome.out_dir / "check.json").read_text())
    tampered = store.read_entry(trace.key).digests()["genai_config.json"]
    assert check["judged"]["genai_config.json"] == tampered  # the file the decode ran with

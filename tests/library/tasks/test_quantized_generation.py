"""int4 and int8 generation (issue 35): a text-generation recipe with ``quantize.method`` publishes
a folder that onnxruntime-genai runs quantized (``genai_config.json`` names
``model.quantized.onnx``), the float model beside it; evaluate decodes the quantized folder and
the check reports its agreement with the float decode, gated or report-only."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.library.tasks.reference import REFERENCE_DECODE
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import compose_recipe, validate_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.builds import build_composed
from tests.helpers.release_skips import NEEDS_DECODING_TASKS
from tests.helpers.statuses import statuses

#: Each test builds or runs a decoding task.
pytestmark = NEEDS_DECODING_TASKS

RECIPE = "zoo_llama_generate"
#: recipes/base/generate.yaml's prompts.
PROMPTS = [[17, 93, 41, 8, 120, 66, 5], [71, 30, 99, 12]]


def _build(tmp_path: Path, *overrides: str) -> BuildOutcome:
    return build_composed([f"recipe={RECIPE}", *overrides], tmp_path)


@pytest.fixture(scope="module")
def int4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildOutcome]:
    tmp_path = tmp_path_factory.mktemp("int4gen")
    return tmp_path, _build(tmp_path, "quantize.method=int4_block")


def _og_decode(config: Any, prompt: list[int], steps: int) -> list[int]:
    """onnxruntime-genai's greedy decode of ``prompt`` (the README's lines)."""
    import onnxruntime_genai as og

    model = og.Model(config)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], dtype=np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt) :]


def test_onnxruntime_genai_runs_the_quantized_model_of_the_published_folder(
    int4: tuple[Path, BuildOutcome],
) -> None:
    import onnxruntime_genai as og

    _, outcome = int4
    assert outcome.exit_code == 0, outcome.result.error
    folder = outcome.out_dir
    genai = json.loads((folder / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "model.quantized.onnx"
    report = json.loads((folder / "report.json").read_text())
    assert report["files"]["genai_config.json"]["stage"] == "quantize"  # not the trace's
    # The trace's time in transformers' reference decode is reported apart (verification).
    trace = next(s for s in report["stages"] if s["name"] == "trace")
    assert 0 < trace["spans"][REFERENCE_DECODE] < trace["seconds"]

    # The quantized model: MatMulNBits in the layers' one function, the builder's CPU level.
    model = onnx.load(folder / "model.quantized.onnx", load_external_data=False)
    assert [f.name for f in model.functions] == ["KVStep"]
    nbits = [n for n in model.functions[0].node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 7  # q, k, v, o, gate, up, down
    assert all({a.name: a.i for a in n.attribute}["accuracy_level"] == 4 for n in nbits)

    check = json.loads((folder / "check.json").read_text())
    decode = check["quantized"]["decode"]
    generation = json.loads((folder / "generation_check.json").read_text())
    prompts = [s["reference"] for s in generation["sequences"]]  # float tokens (= torch's)
    recipe_prompts = PROMPTS
    steps = len(prompts[0])
    for i, prompt in enumerate(recipe_prompts):
        # What a user of the folder gets: the quantized model's tokens, as evaluate decoded them.
        quantized = _og_decode(str(folder), prompt, steps)
        assert quantized == decode["sequences"][i]["free_running"]
        # The float model stays beside it: the same folder with decoder.filename overlaid.
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
        assert _og_decode(config, prompt, steps) == prompts[i]
    # int4 on random weights changes some tokens (the top-2 gaps are ~1e-3): the folder runs
    # the quantized model, not the float one.
    assert any(s["free_running"] != prompts[i] for i, s in enumerate(decode["sequences"][:2]))


def test_evaluate_loads_each_folder_into_onnxruntime_genai_once(
    int4: tuple[Path, BuildOutcome], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decode of a folder (each prompt; forced and free for the quantized one) shares one
    ``og.Model``: a load creates an ONNX Runtime session, seconds for a large model. It is let
    go before the padded batch's ONNX Runtime session of the same weights is made."""
    import dataclasses
    import gc
    import weakref

    import onnxruntime_genai as og

    from hyperexport.library.tasks import decode

    tmp_path, first = int4
    loaded: list[str] = []
    alive: list[weakref.ref[Any]] = []
    real, real_config, real_session = og.Model, og.Config, decode.session
    folders: dict[int, str] = {}  # id of an og.Config -> its folder

    def config(folder: str) -> Any:
        made = real_config(folder)
        folders[id(made)] = folder
        return made

    def counting(source: Any) -> Any:
        folder = source if isinstance(source, str) else folders[id(source)]
        loaded.append(next(Path(folder).glob("model*.onnx")).name)
        model = real(source)
        alive.append(weakref.ref(model))
        return model

    def session(path: Path) -> Any:
        gc.collect()
        assert [r for r in alive if r() is not None] == [], f"a genai model is alive at {path}"
        return real_session(path)

    from hyperexport.library.tasks import genai_runtime

    cloned: list[Path] = []
    real_clone = genai_runtime.clone_or_copy

    def clone(src: Path, dst: Path) -> str:
        cloned.append(src)
        return real_clone(src, dst)

    monkeypatch.setattr(og, "Config", config)
    monkeypatch.setattr(og, "Model", counting)
    monkeypatch.setattr(decode, "session", session)
    monkeypatch.setattr(genai_runtime, "clone_or_copy", clone)
    recipe, settings = compose_recipe(
        [
            f"recipe={RECIPE}",
            "quantize.method=int4_block",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'again'}",
        ]
    )
    settings = dataclasses.replace(settings, force=("evaluate",))
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0, outcome.lines
    assert statuses(outcome)["evaluate"] == "ran"
    assert sorted(loaded) == ["model.onnx", "model.quantized.onnx"]
    assert cloned == []  # both folders loaded where the build checked them out

    # The same decodes, float and quantized, as the first build's.
    def read(folder: Path, name: str) -> Any:
        return json.loads((folder / name).read_text())

    again, before = outcome.out_dir, first.out_dir
    assert read(again, "generation_check.json") == read(before, "generation_check.json")
    assert read(again, "check.json")["quantized"] == read(before, "check.json")["quantized"]


def test_the_check_reports_token_agreement_and_logits_cosine(
    int4: tuple[Path, BuildOutcome],
) -> None:
    _, outcome = int4
    check = json.loads((outcome.out_dir / "check.json").read_text())
    decode = check["quantized"]["decode"]
    # The generate recipes (random weights) report and do not gate: recipes/base/generate.yaml.
    assert decode["gate"] is False and decode["passed"] is True
    assert decode["runtime"] == "onnxruntime-genai" and decode["batch_runtime"] == "onnxruntime"
    names = [s["name"] for s in decode["sequences"]]
    assert names == ["prompt 0", "prompt 1", "padded batch row 0", "padded batch row 1"]
    for s in decode["sequences"]:
        assert s["steps"] == 16 and len(s["cosine_per_step"]) == 16
        assert 0.9 < s["min_cosine"] < 1.0  # int4 moved the logits, a little
        assert s["agreeing_steps"] == round(s["token_agreement"] * 16)
    # The padded batch in ONNX Runtime was fed the same tokens: the same agreement per prompt.
    assert [s["agreeing_steps"] for s in decode["sequences"][2:]] == [
        s["agreeing_steps"] for s in decode["sequences"][:2]
    ]
    steps = sum(s["steps"] for s in decode["sequences"])
    agreed = sum(s["agreeing_steps"] for s in decode["sequences"])
    assert decode["token_agreement"] == pytest.approx(agreed / steps)
    assert 0.5 < decode["token_agreement"] < 1.0
    summary = (outcome.out_dir / "check.txt").read_text()
    assert "quantized decode reported, not gated" in summary


def test_gated_decode_fails_the_check_alone_and_names_the_gate(
    int4: tuple[Path, BuildOutcome],
) -> None:
    tmp_path, first = int4
    agreement = json.loads((first.out_dir / "check.json").read_text())["quantized"]["decode"][
        "token_agreement"
    ]
    outcome = _build(
        tmp_path,
        "quantize.method=int4_block",
        "check.quantized.decode=gate",
        f"check.quantized.min_token_agreement={min(agreement + 0.05, 1.0)}",
    )
    assert list(statuses(outcome).values()) == ["hit"] * 5 + ["failed"]  # the check's alone
    assert outcome.exit_code == 1 and outcome.result.error is not None
    assert outcome.result.error.stage == "check"
    assert f"quantized decode check failed: token agreement {agreement:.3f} <" in str(
        outcome.result.error
    )
    passing = _build(
        tmp_path,
        "quantize.method=int4_block",
        "check.quantized.decode=gate",
        f"check.quantized.min_token_agreement={agreement}",
        "check.quantized.min_decode_cosine=0.9",
    )
    assert passing.exit_code == 0, passing.result.error


def test_int8_generation_runs_quantized_in_onnxruntime_genai(tmp_path: Path) -> None:
    outcome = _build(tmp_path, "quantize.method=int8_dynamic")
    assert outcome.exit_code == 0, outcome.result.error
    genai = json.loads((outcome.out_dir / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["filename"] == "model.quantized.onnx"
    model = onnx.load(outcome.out_dir / "model.quantized.onnx", load_external_data=False)
    assert any(n.op_type == "DynamicQuantizeMatMul" for n in model.functions[0].node)
    decode = json.loads((outcome.out_dir / "check.json").read_text())["quantized"]["decode"]
    assert decode["min_cosine"] > 0.9 and len(decode["sequences"]) == 4


def _tiny_recipe(quantize: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "t",
        "model": {"_target_": "hyperexport.zoo.tiny_llama"},
        "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64", "low": 0, "high": 128}},
        "hiera": ["transformers.models.llama.modeling_llama.LlamaDecoderLayer"],
        "dynamo": False,
        "quantize": quantize,
    }


def test_accuracy_level_is_validated_where_the_schema_defines_it() -> None:
    recipe = _tiny_recipe({"method": "int4_block", "accuracy_level": 5})
    with pytest.raises(RecipeError) as info:
        validate_recipe(recipe, "/r/t.yaml")
    assert info.value.field == "quantize.accuracy_level"
    assert "\n" not in str(info.value)
    default = validate_recipe({**recipe, "quantize": {"method": "int4_block"}}, "/r/t.yaml")
    assert default.data["quantize"]["accuracy_level"] == 4


def test_symmetric_int4_generation_has_no_zero_points_and_decodes(tmp_path: Path) -> None:
    """``quantize.symmetric``: the builder's int4 layout, two quantized inputs per weight, checked
    at every call site and decoded in onnxruntime-genai like the default blocks."""
    outcome = _build(tmp_path, "quantize.method=int4_block", "quantize.symmetric=true")
    assert outcome.exit_code == 0, outcome.result.error
    model = onnx.load(outcome.out_dir / "model.quantized.onnx", load_external_data=False)
    nbits = [n for n in model.functions[0].node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 7 and all(len(n.input) == 3 for n in nbits)
    assert not [i.name for i in model.graph.initializer if i.name.endswith("zero_points")]
    assert outcome.report["check"]["ok"] is True  # every call site within the tolerance
    decode = json.loads((outcome.out_dir / "check.json").read_text())["quantized"]["decode"]
    assert decode["min_cosine"] > 0.9 and len(decode["sequences"]) == 4


def test_shared_embedding_is_validated_against_the_method() -> None:
    recipe = _tiny_recipe({"method": "int8_dynamic", "shared_embedding": True})
    with pytest.raises(RecipeError) as info:
        validate_recipe(recipe, "/r/t.yaml")
    assert info.value.field == "quantize.shared_embedding"
    assert "int4_block" in str(info.value) and "\n" not in str(info.value)


def test_a_shared_embedding_leaves_no_float_table_and_decodes(tmp_path: Path) -> None:
    """``quantize.shared_embedding`` on tied embeddings: the embedding gathers ``lm_head``'s
    int4 rows (the builder's layout), the float table is gone from the quantized model, every
    call site is checked and onnxruntime-genai decodes it."""
    outcome = _build(
        tmp_path,
        "quantize.method=int4_block",
        "quantize.symmetric=true",
        "quantize.shared_embedding=true",
        "+model.config.tie_word_embeddings=true",
        # tied random weights repeat one token: still compared token for token
        "check.generation.min_distinct=1",
    )
    assert outcome.exit_code == 0, outcome.result.error
    model = onnx.load(outcome.out_dir / "model.quantized.onnx", load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GatherBlockQuantized") == 1 and "Gather" not in [
        n.op_type
        for n in model.graph.node
        if n.input and n.input[0].endswith("embed_tokens.weight")
    ]
    floats = [i.name for i in model.graph.initializer if i.name.endswith("embed_tokens.weight")]
    assert floats == []
    assert outcome.report["check"]["ok"] is True
    decode = json.loads((outcome.out_dir / "check.json").read_text())["quantized"]["decode"]
    assert len(decode["sequences"]) == 4 and decode["min_cosine"] > 0.5


def _stats(folder: Path) -> dict[str, tuple[int, ...]]:
    return {
        p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ctime_ns)
        for p in folder.iterdir()
    }


def test_genai_loads_a_checked_out_folder_in_place_and_leaves_it_as_it_was(
    int4: tuple[Path, BuildOutcome], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The float model's folder has no ``genai_config.json``: it is put there for the decode
    and removed after; the model and its data are not copied, nor touched. A folder holding
    another config is loaded from a copy instead, with a WARNING."""
    from hyperexport.library.tasks.genai_runtime import genai_decode, genai_model

    published = int4[1].out_dir
    checkout = tmp_path / "rewrite"
    checkout.mkdir()
    for model_file in published.glob("model.onnx*"):
        shutil.copyfile(model_file, checkout / model_file.name)
    genai = json.loads((published / "genai_config.json").read_text())
    genai["model"]["decoder"]["filename"] = "model.onnx"
    config = tmp_path / "trace" / "genai_config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(genai))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    before = _stats(checkout)
    with genai_model(checkout, config, scratch) as model:
        assert (checkout / "genai_config.json").read_bytes() == config.read_bytes()
        assert list(scratch.iterdir()) == []  # nothing cloned
        in_place = genai_decode(model, PROMPTS[0], 4)[0]
    assert _stats(checkout) == before  # the config gone, the model files untouched

    (checkout / "genai_config.json").write_text("{}")  # not this model's
    with caplog.at_level(logging.WARNING), genai_model(checkout, config, scratch) as model:
        assert [p.name[:6] for p in scratch.iterdir()] == ["genai-"]
        copied = genai_decode(model, PROMPTS[0], 4)[0]
    assert "another genai_config.json is there" in caplog.text
    assert list(scratch.iterdir()) == [] and (checkout / "genai_config.json").read_text() == "{}"
    assert copied == in_place

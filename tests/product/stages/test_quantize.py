"""The quantize stage on a zoo decoder (default run): int4 inside per_type functions, the check
of the quantized model against the float one, reruns, refusals, and ``quantize.method: none``."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hyperexport.base.contracts.names import MODEL_FILE, QUANTIZED_MODEL_FILE
from hyperexport.base.errors import RecipeError
from hyperexport.engine.store import CacheStore
from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import BuildSettings, Recipe, compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader
from tests.helpers.release_skips import NEEDS_QWEN3
from tests.helpers.statuses import statuses

#: The tests quantize recipes/zoo_qwen3.yaml.
pytestmark = NEEDS_QWEN3

RECIPE = ["recipe=zoo_qwen3", "functions=per_type", "dynamic=none"]


def _build(tmp_path: Path, *overrides: str, force: tuple[str, ...] = ()) -> BuildOutcome:
    recipe, settings = _compose(tmp_path, *overrides)
    settings = BuildSettings(**{**vars(settings), "force": force})
    return run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))


def _compose(tmp_path: Path, *overrides: str) -> tuple[Recipe, BuildSettings]:
    return compose_recipe(
        [
            *RECIPE,
            *overrides,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check(outcome: BuildOutcome) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((outcome.out_dir / "check.json").read_text())
    return data


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BuildOutcome]:
    tmp_path = tmp_path_factory.mktemp("quantize")
    return tmp_path, _build(tmp_path, "quantize.method=int4_block")


def test_int4_lands_inside_the_shared_functions_and_passes_the_check(
    built: tuple[Path, BuildOutcome],
) -> None:
    _, outcome = built
    assert outcome.exit_code == 0, outcome.result.error
    model = ir.load(outcome.out_dir / QUANTIZED_MODEL_FILE)
    float_model = ir.load(outcome.out_dir / MODEL_FILE)
    assert set(model.functions) == set(float_model.functions)  # one function per structure
    layers = [n for n in model.graph if n.domain == "hyperexport.fn"]
    assert len(layers) == len([n for n in float_model.graph if n.domain == "hyperexport.fn"]) > 1
    for function in model.functions.values():
        ops = Counter(n.op_type for n in function)
        float_ops = Counter(n.op_type for n in float_model.functions[function.identifier()])
        assert ops["MatMulNBits"] > 0
        # every weight MatMul became MatMulNBits; the attention's data MatMuls remain
        assert ops["MatMul"] + ops["MatMulNBits"] == float_ops["MatMul"]
    quantized = _check(outcome)["quantized"]
    assert quantized["passed"] and quantized["worst_function"]
    comparison = quantized["comparison"]
    assert comparison["outputs"] and all(o["cosine"] > 0.95 for o in comparison["outputs"])
    assert len(comparison["functions"]) == len(
        json.loads((outcome.out_dir / "manifest.json").read_text())["calls"]
    )
    assert (outcome.out_dir / QUANTIZED_MODEL_FILE).stat().st_size < (
        outcome.out_dir / MODEL_FILE
    ).stat().st_size


def test_a_threshold_change_reruns_only_check(built: tuple[Path, BuildOutcome]) -> None:
    tmp_path, _ = built
    again = _build(tmp_path, "quantize.method=int4_block", "check.quantized.min_cosine=0.9")
    ran = {name for name, status in statuses(again).items() if status == "ran"}
    assert ran == {"check"}


def test_a_method_change_reruns_quantize_evaluate_and_check_only(
    built: tuple[Path, BuildOutcome],
) -> None:
    tmp_path, first = built
    again = _build(tmp_path, "quantize.method=int8_dynamic")
    assert again.exit_code == 0, again.result.error
    ran = {name for name, status in statuses(again).items() if status == "ran"}
    assert ran == {"quantize", "evaluate", "check"}  # evaluate runs the new quantized model
    model = ir.load(again.out_dir / QUANTIZED_MODEL_FILE)
    assert any(n.op_type == "DynamicQuantizeMatMul" for f in model.functions.values() for n in f)
    assert _digest(again.out_dir / MODEL_FILE) == _digest(first.out_dir / MODEL_FILE)


def test_method_none_does_no_work_and_keeps_the_float_model(
    built: tuple[Path, BuildOutcome],
) -> None:
    tmp_path, first = built
    plain = _build(tmp_path)
    assert plain.exit_code == 0, plain.result.error
    assert not (plain.out_dir / QUANTIZED_MODEL_FILE).exists()
    assert "quantized" not in _check(plain)
    assert _digest(plain.out_dir / MODEL_FILE) == _digest(first.out_dir / MODEL_FILE)
    entry = plain.result.entries["quantize"]
    assert not entry.outputs  # nothing written, nothing stored


def test_an_exclude_naming_no_module_is_refused(built: tuple[Path, BuildOutcome]) -> None:
    tmp_path, _ = built
    outcome = _build(tmp_path, "quantize.method=int4_block", "quantize.exclude=[lm_haed]")
    error = outcome.result.error
    assert error is not None and isinstance(error.__cause__, RecipeError)
    assert error.__cause__.field == "quantize.exclude[0]" and "lm_haed" in str(error)


def test_one_corrupted_layer_fails_the_check_naming_it(
    built: tuple[Path, BuildOutcome], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # In a copy of the cache: the corrupted quantize entry is committed (the check fails after
    # it), under the key of the clean one, which the other tests of this module hit.
    shutil.copytree(built[0] / "cache", tmp_path / "cache")
    tensors = QuantizeMatMulsPass._tensors

    def corrupt(self: QuantizeMatMulsPass, tensor: Any, transposed: bool) -> list[np.ndarray]:
        arrays = tensors(self, tensor, transposed)
        if tensor.name == "layers.1.self_attn.o_proj.weight":  # one layer's codes scrambled
            packed = arrays[0]
            arrays[0] = np.random.default_rng(0).integers(0, 256, packed.shape, dtype=np.uint8)
        return arrays

    monkeypatch.setattr(QuantizeMatMulsPass, "_tensors", corrupt)
    outcome = _build(tmp_path, "quantize.method=int4_block", force=("quantize",))
    assert outcome.exit_code == 1
    quantized = _check(outcome)["quantized"]
    assert not quantized["passed"] and quantized["worst_function"] == "layers.1"
    assert "layers.1" in str(outcome.result.error)
    summary = (outcome.out_dir / "check.txt").read_text()
    assert "largest error: layers.1 " in summary


def _scale_quantized_scales(store: CacheStore, key: str, factor: float) -> None:
    """What a writer of the shared cache can do: the quantize entry's model with every
    quantized weight's scales (``*.q4_scales``/``*.q8_scales``: initializers, or ``Constant``
    nodes of per_instance functions) times ``factor``, stored as a new blob under its true
    digest, and the entry pointing at it (so every digest the cache checks is consistent)."""
    entry = store.read_entry(key)
    (model_file,) = [f for f in entry.outputs if f.path == QUANTIZED_MODEL_FILE]
    assert not any(f.path.endswith(".data") for f in entry.outputs)  # one self-contained file
    model = ir.from_proto(onnx.load_from_string(store.blob_path(model_file.digest).read_bytes()))

    def times(tensor: Any) -> ir.Tensor:
        array = tensor.numpy()
        return ir.Tensor((array * factor).astype(array.dtype))

    scaled = []
    for name, value in model.graph.initializers.items():
        if name.endswith(("q4_scales", "q8_scales")) and value.const_value is not None:
            value.const_value = times(value.const_value)
            scaled.append(name)
    for function in model.functions.values():
        for node in function:
            if node.op_type == "Constant" and str(node.outputs[0].name).endswith("_scales"):
                tensor = times(node.attributes["value"].as_tensor())
                node.attributes["value"] = ir.AttrTensor("value", tensor)
                scaled.append(str(node.outputs[0].name))
    assert scaled
    data = ir.to_proto(model).SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    blob = store.blob_path(digest)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    path = store.action_path(key)
    record = json.loads(path.read_text())
    record["outputs"] = [
        [p, digest, len(data)] if p == QUANTIZED_MODEL_FILE else [p, d, s]
        for p, d, s in record["outputs"]
    ]
    path.write_text(json.dumps(record))


def test_a_tampered_quantized_model_in_the_cache_fails_the_check(
    built: tuple[Path, BuildOutcome], tmp_path: Path
) -> None:
    """Issue 32: the check judged the quantize stage's record of its model. A cache entry whose
    model had its scales times 1.3 (and consistent digests) was published with "quantized check
    passed": the record was the untampered model's. The evaluate stage now runs the file the
    entry holds, the one the build publishes."""
    source, first = built
    cache = tmp_path / "cache"
    shutil.copytree(source / "cache", cache)
    store = CacheStore(cache)
    _scale_quantized_scales(store, first.result.entries["quantize"].key, 1.3)
    recipe, settings = _compose(tmp_path, "quantize.method=int4_block")
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 1
    assert statuses(outcome)["quantize"] == "hit"  # the tampered entry was served ...
    error = outcome.result.error
    assert error is not None and error.stage == "check"  # ... and judged
    assert re.search(
        r"quantized check failed: output \S+: FAILED cosine 0\.\d+ < 0\.95", str(error)
    )
    check = json.loads((outcome.out_dir / "check.json").read_text())
    tampered = store.read_entry(first.result.entries["quantize"].key).digests()
    assert check["judged"][QUANTIZED_MODEL_FILE] == tampered[QUANTIZED_MODEL_FILE]
    assert not (tmp_path / "out" / "zoo_qwen3" / "default").exists()  # nothing published


def test_the_check_names_every_published_model_file_by_the_digest_its_key_covers(
    built: tuple[Path, BuildOutcome],
) -> None:
    tmp_path, _ = built
    outcome = _build(tmp_path, "quantize.method=int4_block")  # hits; published again
    check = _check(outcome)
    published = {
        name: _digest(outcome.out_dir / name)
        for name in (MODEL_FILE, "manifest.json", QUANTIZED_MODEL_FILE, "manifest.quantized.json")
    }
    assert {k: v for k, v in check["judged"].items() if k in published} == published
    assert set(check["judged"]) == {
        f.path for s in ("rewrite", "quantize") for f in outcome.result.entries[s].outputs
    }
    record = json.loads(
        (tmp_path / "cache" / "runs" / "zoo_qwen3" / "check.json").read_text()
    )  # the check's key material: every judged digest is one of its upstream digests
    upstream = {p: d for files in record["material"]["upstream"].values() for p, d in files.items()}
    assert all(upstream[name] == digest for name, digest in check["judged"].items())
    summary = (outcome.out_dir / "check.txt").read_text()
    assert f"judged {QUANTIZED_MODEL_FILE}: sha256 {published[QUANTIZED_MODEL_FILE]}" in summary


def test_evaluate_runs_the_float_model_once_for_both_comparisons(
    built: tuple[Path, BuildOutcome], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quantized model is compared with the float model's outputs the evaluation computed
    (and judged against torch): the float model is not run a second time."""
    from hyperexport.library.check import model_evaluator, whole_model_runs

    tmp_path, _ = built
    ran: list[str] = []
    calls: list[str] = []
    end_to_end, run_functions = (
        whole_model_runs.run_end_to_end,
        model_evaluator.ModelEvaluator.run_functions,
    )

    def counting_end_to_end(path: Path, *args: Any, **kwargs: Any) -> Any:
        ran.append(Path(path).name)
        return end_to_end(path, *args, **kwargs)

    def counting_functions(self: Any, indices: Any, reason: str) -> Any:
        before = len(self.function_runs())
        runs = run_functions(self, indices, reason)
        calls.append(f"{self.model_path.name}: {len(self.function_runs()) - before}")
        return runs

    monkeypatch.setattr(whole_model_runs, "run_end_to_end", counting_end_to_end)
    monkeypatch.setattr(model_evaluator, "run_end_to_end", counting_end_to_end)
    monkeypatch.setattr(model_evaluator.ModelEvaluator, "run_functions", counting_functions)
    outcome = _build(tmp_path, "quantize.method=int4_block", force=("evaluate",))
    assert outcome.exit_code == 0, outcome.result.error
    assert sorted(ran) == [MODEL_FILE, QUANTIZED_MODEL_FILE]
    sites = len(json.loads((outcome.out_dir / "manifest.json").read_text())["calls"])
    assert calls == [f"{MODEL_FILE}: 0", f"{QUANTIZED_MODEL_FILE}: {sites}"]

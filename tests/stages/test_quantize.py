"""The quantize stage on a zoo decoder (default run): int4 inside per_type functions, the check
of the quantized model against the float one, reruns, refusals, and ``quantize.method: none``."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.builds.session import BuildOutcome, run_build
from hyperexport.config import BuildSettings, Recipe, compose_recipe
from hyperexport.contracts.names import MODEL_FILE, QUANTIZED_MODEL_FILE
from hyperexport.errors import RecipeError
from hyperexport.passes.quantize_matmul import QuantizeMatMulsPass
from hyperexport.stages import PIPELINE, model_loader
from tests.helpers.statuses import statuses

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


def test_a_method_change_reruns_quantize_and_check_only(built: tuple[Path, BuildOutcome]) -> None:
    tmp_path, first = built
    again = _build(tmp_path, "quantize.method=int8_dynamic")
    assert again.exit_code == 0, again.result.error
    ran = {name for name, status in statuses(again).items() if status == "ran"}
    assert ran == {"quantize", "check"}
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
    built: tuple[Path, BuildOutcome], monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path, _ = built
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

"""The check in two steps: evaluate (ONNX Runtime) once, judge (numpy) under any tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from check_toys import BLOCK, LINEAR, edited, make_toy, make_weights

from hyperexport.base.errors import CheckError
from hyperexport.library.check import CheckSettings, Tolerance, run_checks
from hyperexport.library.check.evaluation import EVALUATION_JSON, Evaluation, FunctionRun, OutputRun
from hyperexport.library.check.judge import judge
from hyperexport.library.check.model_evaluator import ModelEvaluator, evaluate_model
from hyperexport.library.check.results import StructuralResult
from hyperexport.library.check.tensors import CapturedArrays

FULL = CheckSettings(expected_classes=(BLOCK, LINEAR), expected_opset=18, expected_dynamo=False)


def _json(report) -> dict:
    data = report.to_json()
    assert "timings" not in data  # check.json is the same bytes in every fresh cache
    assert not any("seconds" in f for f in data["functions"])
    return data


def test_saved_evaluation_judges_like_run_checks(save_toy, tmp_path: Path) -> None:
    toy = make_toy("per_type")
    path = save_toy(toy)
    evaluation = evaluate_model(path, toy.manifest, toy.capture, toy.arrays, FULL)
    out = tmp_path / "evaluation"
    out.mkdir()
    evaluation.save(out)
    loaded = Evaluation.load(out)
    assert loaded == evaluation
    assert set(loaded.arrays) == {r.array for r in evaluation.runs()}
    reference = CapturedArrays(toy.capture, toy.arrays)
    judged = judge(loaded, toy.manifest, toy.capture, reference, FULL)
    direct = run_checks(path, toy.manifest, toy.capture, toy.arrays, FULL)
    assert judged.ok and _json(judged) == _json(direct)


def test_a_tolerance_is_applied_without_running_anything(save_toy) -> None:
    toy = make_toy("per_type", model_weights=edited(make_weights(), "b1"))
    evaluation = evaluate_model(save_toy(toy), toy.manifest, toy.capture, toy.arrays, FULL)
    reference = CapturedArrays(toy.capture, toy.arrays)

    def forbidden(indices):
        raise AssertionError(f"nothing may run: {indices}")

    strict = judge(evaluation, toy.manifest, toy.capture, reference, FULL, forbidden)
    assert not strict.end_to_end_ok and strict.first_divergent_module == "head"
    # Loose enough for the 0.5 edit; block's outputs (max 0.42) then prove nothing: accepted.
    loose_settings = CheckSettings(
        atol=0.6, expected_classes=FULL.expected_classes, accept_vacuous=("block#0/out.0",)
    )
    loose = judge(evaluation, toy.manifest, toy.capture, reference, loose_settings, forbidden)
    assert loose.end_to_end_ok and loose.functions_ok and loose.first_divergent_module is None
    assert loose.outputs[0].atol == 0.6  # the new tolerance, on the same numbers
    assert [o.max_abs for o in loose.outputs] == [o.max_abs for o in strict.outputs]
    assert any(o.max_abs for o in strict.outputs)


def test_the_judge_localises_by_running_the_calls_evaluate_skipped(save_toy) -> None:
    toy = make_toy("per_type", model_weights=edited(make_weights(), "b1"))
    path = save_toy(toy)
    scope = CheckSettings(function_scope="none")
    evaluator = ModelEvaluator(path, toy.manifest, toy.capture, toy.arrays)
    evaluation = evaluator.evaluate(scope)
    assert evaluation.functions == ()
    asked: list[list[int]] = []

    def run_more(indices):
        asked.append(list(indices))
        return evaluator.run_functions(indices, "localisation"), evaluator.computed

    reference = CapturedArrays(toy.capture, toy.arrays)
    report = judge(evaluation, toy.manifest, toy.capture, reference, scope, run_more)
    assert report.first_divergent_module == "head"
    assert all(len(a) == 1 for a in asked) and asked[0] == [0]  # in execution order, one by one
    assert {f.reason for f in report.functions} == {"localisation"}
    assert "head#1" in report.unchecked_calls


def test_bfloat16_arrays_round_trip_as_bits(tmp_path: Path) -> None:
    array = np.array([[1.5, -2.25], [3.0, 0.1]], dtype=ml_dtypes.bfloat16)
    evaluation = Evaluation(
        model_path="m.onnx",
        structural=(StructuralResult("checker", True, "ok"),),
        outputs=(OutputRun("y", "out.0", "e2e/y"),),
        end_to_end_error=None,
        end_to_end_skipped=None,
        functions=(FunctionRun(0, "f#0", (OutputRun("output 0", "f#0/out.0", "fn/f#0/0"),)),),
        arrays={"e2e/y": array, "fn/f#0/0": np.arange(3, dtype=np.float32)},
    )
    evaluation.save(tmp_path)
    with np.load(tmp_path / "evaluation.npz", allow_pickle=False) as stored:
        assert stored["e2e/y"].dtype == np.uint16  # plain bits on disk, no pickle
    loaded = Evaluation.load(tmp_path)
    assert loaded.arrays["e2e/y"].dtype == array.dtype
    assert np.array_equal(loaded.arrays["e2e/y"].view(np.uint16), array.view(np.uint16))
    assert loaded == evaluation


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(format=99), "has format 99"),
        (lambda r: r["outputs"][0].update(array="e2e/missing"), "names arrays"),
        (lambda r: r.pop("functions"), "is not an evaluation record"),
        (lambda r: r["dtypes"].update({"fn/f#0/0": "float8"}), "is not an evaluation record"),
    ],
)
def test_a_damaged_record_is_refused(tmp_path: Path, edit, message: str) -> None:
    evaluation = Evaluation(
        model_path="m.onnx",
        structural=(),
        outputs=(OutputRun("y", "out.0", "e2e/y"),),
        end_to_end_error=None,
        end_to_end_skipped=None,
        functions=(FunctionRun(0, "f#0", (OutputRun("output 0", "f#0/out.0", "fn/f#0/0"),)),),
        arrays={"e2e/y": np.zeros(2, np.float32), "fn/f#0/0": np.zeros(2, np.float32)},
    )
    evaluation.save(tmp_path)
    record = json.loads((tmp_path / EVALUATION_JSON).read_text())
    edit(record)
    (tmp_path / EVALUATION_JSON).write_text(json.dumps(record))
    with pytest.raises(CheckError, match=message):
        Evaluation.load(tmp_path)


def test_a_run_for_another_manifest_is_refused(save_toy) -> None:
    toy = make_toy("per_type")
    evaluation = evaluate_model(save_toy(toy), toy.manifest, toy.capture, toy.arrays, FULL)
    wrong = Evaluation(**{**evaluation.__dict__, "functions": (FunctionRun(0, "elsewhere#0", ()),)})
    reference = CapturedArrays(toy.capture, toy.arrays)
    with pytest.raises(CheckError, match="'elsewhere#0' is not in the manifest"):
        judge(wrong, toy.manifest, toy.capture, reference, FULL)


def test_judging_loads_no_onnx_library() -> None:
    code = (
        "import sys\n"
        "import hyperexport.library.check.judge, hyperexport.library.check.evaluation, hyperexport.library.check\n"
        "import hyperexport.product.stages.check\n"
        "print(sorted(m for m in ('onnx', 'onnx_ir', 'onnxruntime', 'sympy', 'torch')"
        " if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stderr


def test_tolerance_overrides_match_output_names_and_keys(save_toy) -> None:
    toy = make_toy("per_type")
    evaluation = evaluate_model(save_toy(toy), toy.manifest, toy.capture, toy.arrays, FULL)
    reference = CapturedArrays(toy.capture, toy.arrays)
    settings = CheckSettings(
        atol=0.0,
        rtol=0.0,
        per_output=(("y", Tolerance(1.0, 0.0)), ("head#0/out.0", Tolerance(2.0, 0.0))),
    )
    report = judge(evaluation, toy.manifest, toy.capture, reference, settings)
    by_name = {o.name: o.atol for o in report.outputs}
    assert by_name["y"] == 1.0 and by_name["z"] == 0.0
    head = next(f for f in report.functions if f.call_id == "head#0")
    assert head.outputs[0].atol == 2.0

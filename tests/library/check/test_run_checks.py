"""run_checks on hand-made hierarchical models: parity, localisation, tolerances, scope."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from check_toys import BLOCK, LINEAR, Toy, edited, make_toy, make_weights

from hyperexport.base.errors import CheckError
from hyperexport.library.check import CheckReport, CheckSettings, Tolerance, run_checks

MODES = ["per_type", "per_instance"]
FULL = CheckSettings(expected_classes=(BLOCK, LINEAR), expected_opset=18, expected_dynamo=False)


def check(toy: Toy, path: Path, settings: CheckSettings = FULL) -> CheckReport:
    return run_checks(path, toy.manifest, toy.capture, toy.arrays, settings)


@pytest.mark.parametrize("mode", MODES)
def test_correct_model_passes_every_check(mode: str, save_toy) -> None:
    toy = make_toy(mode)
    report = check(toy, save_toy(toy))
    assert report.ok, report.summary_lines()
    assert [s.name for s in report.structural] == [
        "checker",
        "functions",
        "domains",
        "opsets",
        "metadata",
    ]
    assert [o.name for o in report.outputs] == ["y", "z"]
    assert [f.call_id for f in report.functions] == ["block#0", "block.lin#0", "head#0", "head#1"]
    assert all(f.max_abs is not None and f.max_abs < 1e-5 for f in report.functions)
    assert report.first_divergent_module is None
    assert report.unchecked_calls == ()
    report.raise_for_failure()  # does not raise


@pytest.mark.parametrize("mode", MODES)
def test_edited_weight_fails_and_names_module(mode: str, save_toy) -> None:
    toy = make_toy(mode, model_weights=edited(make_weights(), "b1"))
    report = check(toy, save_toy(toy))
    assert not report.ok
    assert not report.end_to_end_ok
    assert report.first_divergent_module == "head"
    assert report.first_divergent_call == "head#0"
    by_call = {f.call_id: f for f in report.functions}
    assert by_call["block#0"].ok and by_call["block.lin#0"].ok
    assert not by_call["head#0"].ok and not by_call["head#1"].ok  # each call is checked
    with pytest.raises(CheckError, match=r"first divergent module in execution order: 'head'") as e:
        report.raise_for_failure()
    assert "max_abs=" in str(e.value) and "output y [out.0]" in str(e.value)
    assert e.value.module_path == "head"  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", MODES)
def test_nested_divergence_blames_the_inner_module(mode: str, save_toy) -> None:
    toy = make_toy(mode, model_weights=edited(make_weights(), "b0"))
    report = check(toy, save_toy(toy))
    by_call = {f.call_id: f for f in report.functions}
    assert not by_call["block#0"].ok  # the enclosing call diverges too...
    assert report.first_divergent_module == "block.lin"  # ...but the inner one is blamed
    assert "'block.lin'" in (report.failure_message() or "")


@pytest.mark.parametrize("scope", ["none", "first_instance"])
def test_limited_scope_still_localises_an_end_to_end_failure(scope: str, save_toy) -> None:
    toy = make_toy("per_type", model_weights=edited(make_weights(), "b1"))
    report = check(toy, save_toy(toy), CheckSettings(function_scope=scope))
    assert report.first_divergent_module == "head"
    reasons = {f.call_id: f.reason for f in report.functions}
    assert reasons["head#0"] == "localisation"
    assert "head#1" in report.unchecked_calls  # localisation stops at the first divergence


def test_first_instance_checks_fewer_calls(save_toy) -> None:
    toy = make_toy("per_instance")
    path = save_toy(toy)
    full = check(toy, path)
    first = check(toy, path, CheckSettings(function_scope="first_instance"))
    none = check(toy, path, CheckSettings(function_scope="none"))
    assert [f.call_id for f in full.functions] == ["block#0", "block.lin#0", "head#0", "head#1"]
    assert [f.call_id for f in first.functions] == ["block#0", "block.lin#0"]
    assert first.unchecked_calls == ("head#0", "head#1")
    assert none.functions == () and len(none.unchecked_calls) == 4
    assert first.ok and none.ok


def _perturbed(toy: Toy, key: str, delta: float) -> Toy:
    arrays = dict(toy.arrays)
    arrays[key] = arrays[key].copy()
    arrays[key].flat[0] += delta
    return Toy(toy.model, toy.manifest, toy.capture, arrays)


def test_tolerance_violation_fails_and_looser_tolerance_passes(save_toy) -> None:
    toy = _perturbed(make_toy("per_type"), "out.0", 1e-3)
    path = save_toy(toy)
    tight = check(toy, path, CheckSettings(atol=1e-4, rtol=0.0))
    loose = check(toy, path, CheckSettings(atol=1e-2, rtol=0.0))
    assert not tight.ok and loose.ok
    y = tight.outputs[0]
    assert not y.ok and y.mismatched == 1
    assert y.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert (y.atol, y.rtol) == (1e-4, 0.0)
    assert tight.outputs[1].ok
    assert tight.functions_ok and tight.first_divergent_module is None
    assert any("no function diverges" in line for line in tight.summary_lines())
    with pytest.raises(CheckError, match=r"output y \[out.0\]: FAIL max_abs=0.001"):
        tight.raise_for_failure()


@pytest.mark.parametrize("name", ["y", "out.0"])
def test_per_output_override_by_name_or_key(name: str, save_toy) -> None:
    toy = _perturbed(make_toy("per_type"), "out.0", 1e-3)
    path = save_toy(toy)
    override = CheckSettings(atol=1e-4, rtol=0.0, per_output=((name, Tolerance(1e-2, 0.0)),))
    other = CheckSettings(atol=1e-4, rtol=0.0, per_output=(("z", Tolerance(1e-2, 0.0)),))
    report = check(toy, path, override)
    assert report.ok
    assert report.outputs[0].atol == 1e-2 and report.outputs[1].atol == 1e-4
    assert not check(toy, path, other).ok


def test_per_output_override_applies_to_function_outputs(save_toy) -> None:
    toy = _perturbed(make_toy("per_type"), "head#0/out.0", 1e-3)
    path = save_toy(toy)
    tight = CheckSettings(atol=1e-4, rtol=0.0)
    assert not check(toy, path, tight).functions_ok
    relaxed = CheckSettings(atol=1e-4, rtol=0.0, per_output=(("head#0/out.0", Tolerance(1e-2, 0)),))
    assert check(toy, path, relaxed).ok


def test_report_json_round_trips_and_lists_every_function(save_toy) -> None:
    toy = make_toy("per_type", model_weights=edited(make_weights(), "b1"))
    report = check(toy, save_toy(toy))
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["ok"] is False
    assert data["first_divergent_module"] == "head"
    assert [f["call_id"] for f in data["functions"]] == [
        "block#0",
        "block.lin#0",
        "head#0",
        "head#1",
    ]
    assert all("max_abs" in f and "atol" in f["outputs"][0] for f in data["functions"])
    assert {o["name"] for o in data["end_to_end"]["outputs"]} == {"y", "z"}
    lines = report.summary_lines()
    assert lines[0].startswith("check FAILED")
    assert sum(line.startswith("  function ") for line in lines) == 4


def test_external_data_model_passes_full_check(tmp_path: Path) -> None:
    toy = make_toy("per_type")
    path = tmp_path / "model.onnx"
    onnx.save_model(
        ir.to_proto(toy.model),
        str(path),
        save_as_external_data=True,
        size_threshold=0,
        location="model.onnx.data",
    )
    assert (tmp_path / "model.onnx.data").stat().st_size > 0
    loaded = ir.load(path)
    assert isinstance(loaded.graph.initializers["W0"].const_value, ir.ExternalTensor)
    report = check(toy, path)
    assert report.ok, report.summary_lines()
    assert len(report.functions) == 4


def test_external_function_constants_pass_and_are_localised(tmp_path: Path) -> None:
    for weights, guilty in ((make_weights(), None), (edited(make_weights(), "b1"), "head")):
        toy = make_toy("per_instance", model_weights=weights)
        path = tmp_path / ("bad" if guilty else "good") / "model.onnx"
        path.parent.mkdir()
        onnx.save_model(
            ir.to_proto(toy.model),
            str(path),
            save_as_external_data=True,
            size_threshold=0,
            convert_attribute=True,
        )
        constants = [
            n.attributes["value"].value
            for f in ir.load(path).functions.values()
            for n in f
            if n.op_type == "Constant"
        ]
        assert constants and all(isinstance(c, ir.ExternalTensor) for c in constants)
        report = check(toy, path)
        assert report.ok is (guilty is None), report.summary_lines()
        assert report.first_divergent_module == guilty
        assert all(f.error is None for f in report.functions)


def test_external_data_model_with_edited_weight_is_localised(tmp_path: Path) -> None:
    toy = make_toy("per_type", model_weights=edited(make_weights(), "b1"))
    path = tmp_path / "sub" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(ir.to_proto(toy.model), str(path), save_as_external_data=True, size_threshold=0)
    report = check(toy, path)
    assert report.first_divergent_module == "head"


def test_model_that_cannot_run_reports_end_to_end_error(save_toy) -> None:
    toy = make_toy("per_type")
    bad = Toy(
        toy.model, toy.manifest, toy.capture, {**toy.arrays, "in.0": np.zeros((2, 5), np.float32)}
    )
    report = check(bad, save_toy(toy))
    assert not report.ok
    assert report.end_to_end_error is not None and "ONNX Runtime" in report.end_to_end_error


def test_missing_model_file_raises_check_error(tmp_path: Path) -> None:
    toy = make_toy("per_type")
    with pytest.raises(CheckError, match="cannot load"):
        check(toy, tmp_path / "absent.onnx")

"""A reference that proves nothing (NaN, within the tolerance of zero, constant) fails the check."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from check_toys import BLOCK, LINEAR, make_toy, make_weights

from hyperexport.base.errors import CheckError
from hyperexport.library.check import CheckSettings, Tolerance, run_checks
from hyperexport.library.check.evaluation import Evaluation, FunctionRun, OutputRun
from hyperexport.library.check.judge import judge
from hyperexport.library.check.results import CheckReport
from hyperexport.library.check.tensors import CapturedArrays
from hyperexport.library.check.vacuous import exact_constant, vacuous_reason

TOL = Tolerance(atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize(
    ("values", "condition"),
    [
        ([1.0, np.nan, 2.0], "contains NaN (1 of 3 elements)"),
        ([0.0, 0.0, 0.0], "is within the tolerance of zero (max |x| = 0,"),
        ([1e-24, -3e-26, 0.0], "is within the tolerance of zero (max |x| = 1e-24,"),
        ([0.5, 0.5, 0.5, 0.5], "is constant (every element is 0.5)"),
    ],
)
def test_vacuous_references_are_named(values: list[float], condition: str) -> None:
    reason = vacuous_reason(np.asarray(values, dtype=np.float32), TOL)
    assert reason is not None and reason.startswith(condition), reason


@pytest.mark.parametrize(
    "array",
    [
        np.asarray([1e-3, 0.0, -2e-4], dtype=np.float32),  # zeros would fail at 1e-3
        np.asarray([0.0, -np.inf, 0.0], dtype=np.float32),  # an attention mask
        np.asarray([7.0], dtype=np.float32),  # one element is no constant
        np.zeros((2, 3), dtype=np.int64),  # integers are compared exactly
        np.ones(4, dtype=bool),
        np.zeros((0, 3), dtype=np.float32),
    ],
)
def test_references_that_prove_something_pass(array: np.ndarray) -> None:
    assert vacuous_reason(array, TOL) is None


def test_the_floor_is_the_applied_tolerance() -> None:
    small = np.asarray([3e-4, -1e-4], dtype=np.float32)
    assert vacuous_reason(small, TOL) is None
    assert vacuous_reason(small, Tolerance(atol=1e-3, rtol=0.0)) is not None


def test_bfloat16_zeros_are_vacuous() -> None:
    zeros = np.zeros(3, dtype=ml_dtypes.bfloat16)
    assert (vacuous_reason(zeros, TOL) or "").startswith("is within the tolerance of zero")


def _zero_head_toy():  # type: ignore[no-untyped-def]
    """The toy with a head of zeros: y, z and both head calls output exactly 0 in torch too."""
    w = make_weights()
    zero = dataclasses.replace(w, w1=np.zeros_like(w.w1), b1=np.zeros_like(w.b1))
    return make_toy("per_type", model_weights=zero, reference_weights=zero)


SETTINGS = CheckSettings(expected_classes=(BLOCK, LINEAR), expected_opset=18, expected_dynamo=False)


def test_a_model_of_zeros_fails_naming_the_output_and_the_condition(save_toy) -> None:
    toy = _zero_head_toy()
    report = run_checks(save_toy(toy), toy.manifest, toy.capture, toy.arrays, SETTINGS)
    assert not report.ok
    by_name = {o.name: o for o in report.outputs}
    assert not by_name["y"].ok and by_name["y"].mismatched == 0  # ORT agrees, but proves nothing
    assert by_name["y"].vacuous is not None and not by_name["y"].accepted
    with pytest.raises(CheckError) as e:
        report.raise_for_failure()
    message = str(e.value)
    assert "\n" not in message
    assert (
        "output y [out.0]: FAIL: the torch reference is within the tolerance of zero "
        "(max |x| = 0, atol=0.0001, rtol=0.001): an all-zero output would pass, so comparing "
        "with it proves nothing; to accept it, list it in check.accept_vacuous: "
        "'check.accept_vacuous=[\"y\"]'"
    ) in message
    # head's calls output zeros as well: refused, but no divergence to localise
    assert {f.call_id for f in report.functions if not f.ok} == {"head#0", "head#1"}
    assert report.first_divergent_module is None and "first divergent" not in message
    assert (
        "2 function output(s) whose torch reference proves nothing: head#0/out.0 (is within "
        "the tolerance of zero"
    ) in message
    # the suggestion pastes into a shell and through Hydra's parser (issue 34: '#' broke it)
    assert message.endswith("""'check.accept_vacuous=["head#0/out.0","head#1/out.0"]'""")


def test_accepted_vacuous_outputs_pass_and_say_so(save_toy) -> None:
    toy = _zero_head_toy()
    accept = ("y", "z", "head#0/out.0", "head#1/out.0")
    settings = dataclasses.replace(SETTINGS, accept_vacuous=accept)
    report = run_checks(save_toy(toy), toy.manifest, toy.capture, toy.arrays, settings)
    assert report.ok, report.summary_lines()
    y = next(o for o in report.outputs if o.name == "y")
    assert y.accepted and "[vacuous reference accepted: is within the tolerance" in y.describe()
    assert report.to_json()["settings"]["accept_vacuous"] == list(accept)
    patterns = dataclasses.replace(SETTINGS, accept_vacuous=("y", "z", "head#*/out.*"))
    report = run_checks(save_toy(toy), toy.manifest, toy.capture, toy.arrays, patterns)
    assert report.ok, report.summary_lines()
    partly = dataclasses.replace(SETTINGS, accept_vacuous=("y", "z"))  # the functions too
    report = run_checks(save_toy(toy), toy.manifest, toy.capture, toy.arrays, partly)
    assert report.end_to_end_ok and not report.functions_ok


# --- constant by design (issue 34: T5's cross-attention position bias, zeros by construction) --
def _judged(bias_computed: np.ndarray, *, block_ok: bool = True) -> CheckReport:
    """The toy's ``block#0`` run alone with a second output, a bias of zeros in torch (as T5's
    first decoder layer passes on), ``bias_computed`` in ONNX Runtime."""
    toy = make_toy("per_type")
    bias = np.zeros((2, 3), dtype=np.float32)
    bias[0, 0] = -0.0  # a mask's 0 * min, as T5's encoder mask adds it: equal to 0
    reference = {**toy.arrays, "block#0/out.1": bias}
    computed = {
        "f.out.0": toy.arrays["block#0/out.0"] + (0.0 if block_ok else 1.0),
        "f.out.1": bias_computed,
        "g.y": toy.arrays["out.0"],
        "g.z": toy.arrays["out.1"],
    }
    evaluation = Evaluation(
        model_path="toy.onnx",
        structural=(),
        outputs=(OutputRun("y", "out.0", "g.y"), OutputRun("z", "out.1", "g.z")),
        end_to_end_error=None,
        end_to_end_skipped=None,
        functions=(
            FunctionRun(
                0,
                "block#0",
                (
                    OutputRun("output 0", "block#0/out.0", "f.out.0"),
                    OutputRun("output 1", "block#0/out.1", "f.out.1"),
                ),
            ),
        ),
        arrays=computed,
    )
    return judge(
        evaluation, toy.manifest, toy.capture, CapturedArrays(toy.capture, reference), SETTINGS
    )


def test_a_constant_output_beside_a_proving_one_is_judged_by_equality_and_says_so() -> None:
    report = _judged(np.zeros((2, 3), dtype=np.float32))
    assert report.ok, report.summary_lines()
    [call] = report.functions
    bias = call.outputs[1]
    assert bias.ok and bias.exact and not bias.accepted
    assert bias.describe() == (
        "output 1 [block#0/out.1]: ok: constant in torch (every element is 0), equal exactly "
        "in ONNX Runtime"
    )
    assert call.describe().endswith("(output 1: constant in torch, equal exactly)")
    assert report.to_json()["functions"][0]["outputs"][1]["exact"] is True


@pytest.mark.parametrize(
    "computed",
    [
        np.full((2, 3), 1e-9, dtype=np.float32),  # within tolerance, not equal: still refused
        np.zeros((3, 2), dtype=np.float32),
    ],
)
def test_a_constant_output_not_exactly_equal_is_still_refused(computed: np.ndarray) -> None:
    report = _judged(computed)
    bias = report.functions[0].outputs[1]
    assert not report.ok and not bias.ok and not bias.exact


def test_a_constant_output_beside_a_failing_sibling_is_not_judged_by_equality() -> None:
    report = _judged(np.zeros((2, 3), dtype=np.float32), block_ok=False)
    bias = report.functions[0].outputs[1]
    assert not bias.ok and not bias.exact and bias.vacuous is not None


@pytest.mark.parametrize(
    ("expected", "computed", "exact"),
    [
        ([0.5, 0.5], [0.5, 0.5], True),
        ([0.0, -0.0], [0.0, 0.0], True),
        ([0.5, 0.5], [0.5, 0.50001], False),
        ([1e-24, 0.0], [1e-24, 0.0], False),  # tiny, not one value
        ([np.nan, np.nan], [np.nan, np.nan], False),
    ],
)
def test_exact_constant(expected: list[float], computed: list[float], exact: bool) -> None:
    e, c = np.asarray(expected, np.float32), np.asarray(computed, np.float32)
    assert (exact_constant(e, c) is not None) is exact

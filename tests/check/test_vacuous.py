"""A reference that proves nothing (NaN, within the tolerance of zero, constant) fails the check."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from check_toys import BLOCK, LINEAR, make_toy, make_weights

from hyperexport.base.errors import CheckError
from hyperexport.check import CheckSettings, Tolerance, run_checks
from hyperexport.check.vacuous import vacuous_reason

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
        "with it proves nothing; list the output in check.accept_vacuous to accept it"
    ) in message
    # head's calls output zeros as well: refused, but no divergence to localise
    assert {f.call_id for f in report.functions if not f.ok} == {"head#0", "head#1"}
    assert report.first_divergent_module is None and "first divergent" not in message
    assert (
        "2 function output(s) whose torch reference proves nothing (list them in "
        "check.accept_vacuous): head#0/out.0 (is within the tolerance of zero"
    ) in message


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

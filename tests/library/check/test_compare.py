"""compare_arrays: tolerance formula, max diffs, NaN/inf, shape and dtype mismatches."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hyperexport.library.check import CheckSettings, Tolerance
from hyperexport.library.check.compare import compare_arrays

TOL = Tolerance(atol=1e-3, rtol=1e-2)


def cmp(actual: list[float] | np.ndarray, expected: list[float] | np.ndarray, tol: Tolerance = TOL):
    a = np.asarray(actual, dtype=np.float32)
    e = np.asarray(expected, dtype=np.float32)
    return compare_arrays(a, e, tol, name="y", key="out.0")


def test_max_abs_and_rel_and_formula() -> None:
    r = cmp([1.0, 2.0, 10.05], [1.0, 2.0005, 10.0])
    assert r.ok  # 0.05 <= 1e-3 + 1e-2 * 10
    assert r.max_abs == pytest.approx(0.05, rel=1e-4)
    assert r.max_rel == pytest.approx(0.005, rel=1e-3)
    r = cmp([1.0, 2.0, 10.2], [1.0, 2.0, 10.0])
    assert not r.ok and r.mismatched == 1 and r.size == 3


def test_nan_and_inf_positions_must_agree() -> None:
    assert cmp([np.nan, np.inf, -np.inf], [np.nan, np.inf, -np.inf]).ok
    r = cmp([np.nan, 1.0], [1.0, 1.0])
    assert not r.ok and r.max_abs == np.inf and r.mismatched == 1
    assert not cmp([np.inf], [-np.inf]).ok
    assert not cmp([1.0], [np.inf]).ok


def test_shape_and_dtype_mismatch_are_errors() -> None:
    r = cmp([1.0, 2.0], [[1.0, 2.0]])
    assert not r.ok and "shape (2,) != expected (1, 2)" in (r.error or "")
    r = compare_arrays(np.ones(2, np.float16), np.ones(2, np.float32), TOL, name="y", key="k")
    assert not r.ok and "dtype float16" in (r.error or "")


def test_integers_and_empty_arrays() -> None:
    assert compare_arrays(np.arange(3), np.arange(3), TOL, name="i", key="k").ok
    assert not compare_arrays(np.arange(3), np.arange(3) + 1, TOL, name="i", key="k").ok
    assert cmp(np.zeros((0, 3)), np.zeros((0, 3))).ok


def test_bfloat16_compares_values() -> None:
    a = np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16)
    e = np.array([1.0, 2.5], dtype=ml_dtypes.bfloat16)
    r = compare_arrays(a, e, TOL, name="y", key="k")
    assert not r.ok and r.max_abs == pytest.approx(0.5)


def test_settings_validation_and_lookup() -> None:
    with pytest.raises(ValueError, match="function_scope"):
        CheckSettings(function_scope="some")
    with pytest.raises(ValueError, match=">= 0"):
        Tolerance(-1.0, 0.0)
    s = CheckSettings(per_output=(("y", Tolerance(1.0, 0.0)), ("out.0", Tolerance(2.0, 0.0))))
    assert s.tolerance_for("y", "out.0").atol == 1.0
    assert s.tolerance_for("z", "out.0").atol == 2.0
    assert s.tolerance_for("z", "out.1") == Tolerance(1e-4, 1e-3)

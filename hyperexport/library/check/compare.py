"""Compare one actual array with one reference array under a tolerance."""

from __future__ import annotations

import numpy as np

from hyperexport.library.check.results import TensorResult
from hyperexport.library.check.settings import Tolerance


def _as_float64(array: np.ndarray) -> np.ndarray:
    return np.asarray(array).astype(np.float64)


def compare_arrays(
    actual: np.ndarray, expected: np.ndarray, tolerance: Tolerance, *, name: str, key: str
) -> TensorResult:
    """Compare ``actual`` with ``expected`` elementwise.

    An element passes when ``|a - e| <= atol + rtol * |e|``, when both are the same infinity, or
    when both are NaN. Shapes and dtypes must agree exactly.

    Args:
        actual: What ONNX Runtime computed.
        expected: The reference captured at trace time (bfloat16 as ``ml_dtypes.bfloat16``).
        tolerance: The tolerance to apply.
        name: Graph output name or function output label, for the report.
        key: Capture key of ``expected``.

    Returns:
        The comparison result, with max absolute and relative differences.
    """

    def result(
        ok: bool,
        max_abs: float | None,
        max_rel: float | None,
        mismatched: int = 0,
        error: str | None = None,
    ) -> TensorResult:
        return TensorResult(
            name=name,
            key=key,
            ok=ok,
            max_abs=max_abs,
            max_rel=max_rel,
            atol=tolerance.atol,
            rtol=tolerance.rtol,
            size=int(expected.size),
            mismatched=mismatched,
            error=error,
        )

    if actual.shape != expected.shape:
        shapes = f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
        return result(False, None, None, error=shapes)
    if actual.dtype != expected.dtype:
        return result(False, None, None, error=f"dtype {actual.dtype} != expected {expected.dtype}")
    if expected.size == 0:
        return result(True, 0.0, 0.0)
    a = _as_float64(actual)
    e = _as_float64(expected)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        diff = np.where(same, 0.0, np.abs(a - e))
        diff = np.where(np.isnan(diff), np.inf, diff)
        nonfinite = ~same & ~(np.isfinite(a) & np.isfinite(e))
        bad = nonfinite | (diff > tolerance.atol + tolerance.rtol * np.abs(e))
        nonzero = (e != 0) & np.isfinite(e)
        rel = np.divide(diff, np.abs(e), out=np.zeros_like(diff), where=nonzero)
    mismatched = int(np.count_nonzero(bad))
    return result(mismatched == 0, float(diff.max()), float(rel.max()), mismatched=mismatched)

"""References that prove nothing: a comparison with them passes whatever the export computes.

A check against torch is worth something only when a wrong export would fail it. It would not
when the reference is

* **NaN** anywhere: NaN positions only have to agree, and a NaN reference usually means the
  model (or its random weights) is broken, so nothing downstream of it is compared;
* **within the tolerance of zero** everywhere: an export that outputs zeros passes. This is the
  floor: ``|expected| <= atol + rtol * |expected|`` for every element, under the tolerance the
  comparison applies. We chose it over a fixed number (say 1e-6) because it is exactly the
  case where the comparison cannot tell the model from zeros: a random-weight MobileNetV2 gives
  outputs of ~1e-24, an EfficientNet exactly 0, and both passed at ``atol=1e-4``;
* **constant** (every element equal, more than one element): an export that broadcasts one
  number passes, whatever its inputs.

Only floating outputs are judged so: integer and boolean outputs are compared exactly, and a
constant mask or index is a real claim. A recipe accepts a vacuous output by name
(``check.accept_vacuous``).
"""

from __future__ import annotations

import numpy as np

from hyperexport.check.settings import Tolerance


def vacuous_reason(expected: np.ndarray, tolerance: Tolerance) -> str | None:
    """Why comparing with ``expected`` under ``tolerance`` proves nothing; None when it does.

    Args:
        expected: The torch reference (bfloat16 as ``ml_dtypes.bfloat16``).
        tolerance: The tolerance the comparison applies to it.

    Returns:
        The condition, as a phrase (``"contains NaN"``, ``"is constant (every element 0.5)"``,
        ``"is within the tolerance of zero (max |x| = 1e-24, atol=0.0001)"``), or None.
    """
    if expected.size == 0 or not np.issubdtype(_numpy_dtype(expected), np.floating):
        return None
    e = np.asarray(expected).astype(np.float64)
    if np.isnan(e).any():
        return f"contains NaN ({int(np.isnan(e).sum())} of {e.size} elements)"
    magnitude = np.abs(e)
    near_zero = np.isfinite(e) & (magnitude <= tolerance.atol + tolerance.rtol * magnitude)
    if bool(near_zero.all()):
        return (
            f"is within the tolerance of zero (max |x| = {float(magnitude.max()):.3g}, "
            f"atol={tolerance.atol:g}, rtol={tolerance.rtol:g}): an all-zero output would pass"
        )
    if e.size > 1 and bool(np.all(e == e.flat[0])):
        return f"is constant (every element is {float(e.flat[0]):.6g})"
    return None


def _numpy_dtype(array: np.ndarray) -> np.dtype:
    """bfloat16 (an ``ml_dtypes`` type numpy calls 'V') counts as floating."""
    dtype = np.dtype(array.dtype)
    return np.dtype(np.float32) if dtype.name == "bfloat16" else dtype

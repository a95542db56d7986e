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

**Constant by design.** Some outputs are one value whatever the weights and inputs: T5's
cross-attention position bias is zeros by construction (that attention has no relative bias),
passed on from the first decoder layer beside its hidden states. Refusing it made every T5
recipe list it in ``check.accept_vacuous``. Such an output is judged by equality instead
(:func:`exact_constant`): ONNX Runtime must compute the very same value in every element, not
merely one within tolerance, and it counts only beside a sibling output that proves something
(another output of the same call, or another graph output, whose reference is not vacuous and
which passed). The report says "constant in torch (...), equal exactly in ONNX Runtime": that
is all it shows. A lone constant output (a model that multiplies by 0, a call whose every output
is zeros) still fails, and NaN or merely tiny references are never judged so.
"""

from __future__ import annotations

import numpy as np

from hyperexport.library.check.settings import Tolerance


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


def exact_constant(expected: np.ndarray, computed: np.ndarray) -> str | None:
    """How a constant reference was judged by equality, or None when it cannot be.

    Args:
        expected: The torch reference (already found vacuous by :func:`vacuous_reason`).
        computed: What ONNX Runtime computed for it.

    Returns:
        ``"constant in torch (every element is 0), equal exactly in ONNX Runtime"`` when every
        element of ``expected`` is one finite value and ``computed`` has its shape and exactly
        that value everywhere; None otherwise (NaN, values merely near zero, any difference).
    """
    if expected.size == 0 or not np.issubdtype(_numpy_dtype(expected), np.floating):
        return None
    e = np.asarray(expected).astype(np.float64)
    c = np.asarray(computed)
    if c.shape != e.shape or not np.issubdtype(_numpy_dtype(c), np.floating):
        return None
    value = e.flat[0]
    if not np.isfinite(value) or not bool(np.all(e == value)):
        return None
    if not bool(np.all(c.astype(np.float64) == value)):
        return None
    shown = 0.0 if value == 0 else float(value)  # -0.0 (a mask's 0 * -inf floor) reads as 0
    return f"constant in torch (every element is {shown:.6g}), equal exactly in ONNX Runtime"

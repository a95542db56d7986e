"""Low-precision outputs (float16, bfloat16): rounding an upcast run back, and tolerance floors.

numpy only, so that judging an evaluation (``judge.py``) needs no ONNX library. How a
low-precision model is run upcast to float32 is in ``upcast.py``.
"""

from __future__ import annotations

import numpy as np

#: Tolerance floor per captured dtype: ``(atol as a share of max |expected|, rtol)``. A recipe's
#: stricter tolerance is raised to this for outputs of that dtype. The absolute part scales with
#: the output's magnitude because low-precision spacing does (bf16 has 8 significant bits: a
#: residual stream at |x| ~ 8 is rounded in steps of 0.0625); 2**-5 is four bf16 steps at the
#: output's largest magnitude, 2**-8 four fp16 steps. Measured on random-weight Llama/Qwen2
#: decoder layers (recipes/README.md, "Low precision").
TOLERANCE_FLOOR: dict[str, tuple[float, float]] = {
    "bfloat16": (2**-5, 3e-2),
    "float16": (2**-8, 4e-3),
}


def _is_low(dtype: np.dtype) -> bool:
    return dtype == np.float16 or dtype.name == "bfloat16"


def upcast_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Low-precision arrays as float32; others unchanged."""
    return {k: v.astype(np.float32) if _is_low(v.dtype) else v for k, v in feeds.items()}


def round_to(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """An upcast run's float32 output rounded to the captured output's low-precision dtype."""
    low = _is_low(expected.dtype)
    return actual.astype(expected.dtype) if low and actual.dtype == np.float32 else actual


def floored(atol: float, rtol: float, expected: np.ndarray) -> tuple[float, float]:
    """``(atol, rtol)`` raised to the floor of ``expected``'s dtype (others unchanged)."""
    floor = TOLERANCE_FLOOR.get(np.dtype(expected.dtype).name)
    if floor is None or expected.size == 0:
        return atol, rtol
    scale = float(np.nanmax(np.abs(expected.astype(np.float32))))
    return max(atol, floor[0] * scale), max(rtol, floor[1])

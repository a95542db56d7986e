"""The check stage's library: structural checks, end-to-end and per-function parity in ORT.

Usage::

    report = run_checks(model_path, manifest, capture, arrays, CheckSettings(atol=1e-4))
    report.raise_for_failure()  # CheckError naming the output or module and the numbers
"""

from __future__ import annotations

from hyperexport.check.report import (
    CheckFailure,
    CheckReport,
    FunctionResult,
    StructuralResult,
    TensorResult,
)
from hyperexport.check.runner import run_checks
from hyperexport.check.settings import CheckSettings, Tolerance

__all__ = [
    "CheckFailure",
    "CheckReport",
    "CheckSettings",
    "FunctionResult",
    "StructuralResult",
    "TensorResult",
    "Tolerance",
    "run_checks",
]

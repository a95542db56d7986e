"""The check stage's library: structural checks, end-to-end and per-function parity in ORT.

Usage::

    report = run_checks(model_path, manifest, capture, arrays, CheckSettings(atol=1e-4))
    report.raise_for_failure()  # CheckError naming the output or module and the numbers

The check is two steps (``evaluation.py``): ``model_evaluator.py`` runs the model in ONNX Runtime,
``judge.py`` applies the tolerances with numpy alone. Importing this package loads neither ONNX
nor ONNX Runtime: ``run_checks`` is imported on first use, so the judge stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hyperexport import lazy_attributes
from hyperexport.library.check.results import (
    CheckFailure,
    CheckReport,
    FunctionResult,
    StructuralResult,
    TensorResult,
)
from hyperexport.library.check.settings import CheckSettings, Tolerance

if TYPE_CHECKING:
    from hyperexport.library.check.run import run_checks

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


_LAZY = {"run_checks": "hyperexport.library.check.run"}
__getattr__ = lazy_attributes(__name__, _LAZY)

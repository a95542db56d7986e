"""``run_checks``: structural checks, end-to-end parity, per-function parity, one report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.library.check.evaluation import FunctionRun
from hyperexport.library.check.judge import judge
from hyperexport.library.check.model_evaluator import ModelEvaluator
from hyperexport.library.check.results import CheckReport
from hyperexport.library.check.settings import CheckSettings
from hyperexport.library.check.tensors import CapturedArrays


def run_checks(
    model_path: Path,
    manifest: ExportManifest,
    capture: CaptureRecord,
    arrays: Mapping[str, np.ndarray],
    settings: CheckSettings,
) -> CheckReport:
    """Check a final hierarchical model against its manifest and the captured tensors.

    Structural checks, end-to-end parity and per-function parity (for the calls selected by
    ``settings.function_scope``) always run. When end-to-end parity fails, unchecked calls are
    checked in execution order until the divergence is localised. Nothing is re-exported and no
    torch is needed. This is :class:`~hyperexport.library.check.model_evaluator.ModelEvaluator` (what ONNX
    Runtime computes) followed by :func:`~hyperexport.library.check.judge.judge` (the tolerances), the
    two steps the build runs as its ``evaluate`` and ``check`` stages.

    Args:
        model_path: The final model file (external data beside it is followed).
        manifest: The export manifest written with the model.
        capture: The capture record (dtypes of the arrays, nesting of the calls).
        arrays: The captured tensors, by capture key.
        settings: What to check and how strictly.

    Returns:
        The report; call ``raise_for_failure()`` to turn a failure into a ``CheckError``.

    Raises:
        CheckError: When the model file cannot be read at all.
    """
    evaluator = ModelEvaluator(model_path, manifest, capture, arrays)
    evaluation = evaluator.evaluate(settings)

    def run_more(indices: Sequence[int]) -> tuple[list[FunctionRun], dict[str, np.ndarray]]:
        return evaluator.run_functions(indices, "localisation"), evaluator.computed

    reference = CapturedArrays(capture, arrays)
    return judge(evaluation, manifest, capture, reference, settings, run_more)

"""Stage ``check``: the evaluation judged against the capture, under the recipe's tolerances.

Light: numpy only (``check/judge.py``). ONNX Runtime runs here only to localise a failed
whole-model comparison, on the call sites ``evaluate`` did not run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperexport.atomic import atomic_write_bytes
from hyperexport.contracts.names import (
    CHECK_JSON,
    CHECK_SUMMARY,
    MANIFEST_JSON,
    MODEL_FILE,
    REFERENCE_DIR,
)
from hyperexport.generation.names import GENERATION_CHECK, TEXT_GENERATION
from hyperexport.runner.stage import StageInputs

if TYPE_CHECKING:
    import numpy as np

    from hyperexport.check.evaluate import ModelEvaluator
    from hyperexport.check.evaluation import FunctionRun


class CheckStage:
    """``judge`` → ``check.json`` and ``check.txt``; a failed check fails the build.

    The check's outputs are written before it raises, so the report can show them; the runner
    never caches a failed stage. The settings are :func:`~hyperexport.stages.check_settings.
    check_settings` of its slice.
    """

    name: str = "check"
    version: int = 5
    #: ``trace``: the reference decode of ``task: text-generation``.
    upstream: tuple[str, ...] = ("trace", "export", "rewrite", "evaluate")
    reads: tuple[str, ...] = (
        "check",
        "opset",
        "dynamo",
        "fallback",
        "attention.promote_opset24",
        "task",  # generation (issue 23)
    )
    needs_model: bool = False
    #: numpy judges; the ONNX libraries run only for localisation, and then shape the result.
    libraries: tuple[str, ...] = ("numpy", "ml-dtypes", "onnx", "onnx-ir", "onnxruntime")
    publish: tuple[str, ...] = (CHECK_JSON, CHECK_SUMMARY, GENERATION_CHECK)
    artifacts: Mapping[str, str] = {"check": CHECK_JSON, "check_summary": CHECK_SUMMARY}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.check.evaluation import Evaluation
        from hyperexport.check.judge import judge
        from hyperexport.check.tensors import CapturedArrays
        from hyperexport.contracts.capture_files import read_capture
        from hyperexport.contracts.manifest import ExportManifest
        from hyperexport.stages.check_settings import check_settings

        capture = read_capture(inputs.dir("export") / REFERENCE_DIR)
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_JSON).read_text(encoding="utf-8"))
        evaluation = Evaluation.load(inputs.dir("evaluate"))
        settings = check_settings(params, capture.record.hiera, manifest.fallback_from)
        evaluator: ModelEvaluator | None = None

        def run_more(indices: Sequence[int]) -> tuple[list[FunctionRun], dict[str, np.ndarray]]:
            nonlocal evaluator
            if evaluator is None:  # loaded only when a failed comparison needs localising
                from hyperexport.check.evaluate import ModelEvaluator

                evaluator = ModelEvaluator(
                    rewrite_dir / MODEL_FILE, manifest, capture.record, capture.arrays
                )
            return evaluator.run_functions(indices, "localisation"), evaluator.computed

        reference = CapturedArrays(capture.record, capture.arrays)
        report = judge(evaluation, manifest, capture.record, reference, settings, run_more)
        text = json.dumps(report.to_json(), sort_keys=True, indent=1) + "\n"
        atomic_write_bytes(out_dir / CHECK_JSON, text.encode("utf-8"))
        lines = report.summary_lines()
        generation_error = None
        if params.get("task") == TEXT_GENERATION:  # tokens and logits of the decode
            from hyperexport.generation.judge import judge_generation, summary_lines

            results, generation_error = judge_generation(
                inputs.dir("trace"), inputs.dir("evaluate"), out_dir
            )
            lines = [*lines, *summary_lines(results)]
        atomic_write_bytes(out_dir / CHECK_SUMMARY, ("\n".join(lines) + "\n").encode("utf-8"))
        report.raise_for_failure()
        if generation_error is not None:
            raise generation_error

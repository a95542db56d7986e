"""Stage ``evaluate``: the final model's structural checks and ONNX Runtime runs, untoleranced.

Torch-free: it reads the export's reference capture with numpy, loads the model with onnx_ir and
runs ONNX Runtime. It reads no tolerance, so changing one reruns only ``check``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.contracts.names import MANIFEST_JSON, MODEL_FILE, REFERENCE_DIR
from hyperexport.generation.names import TEXT_GENERATION
from hyperexport.runner.stage import StageInputs


class EvaluateStage:
    """``evaluate_model`` → ``evaluation.json`` + ``evaluation.npz`` (``check/evaluation.py``).

    What it finds is judged by the ``check`` stage; a model that runs but is wrong does not fail
    here. A model that cannot be loaded at all does (``CheckError``).
    """

    name: str = "evaluate"
    version: int = 2
    #: The reference capture comes from the export (``reference/``): the capture its bundle was
    #: exported from, which after a fallback is not the trace's.
    #: ``trace``: the reference decode and ``genai_config.json`` of ``task: text-generation``.
    upstream: tuple[str, ...] = ("trace", "export", "rewrite")
    reads: tuple[str, ...] = (
        "check.function_scope",
        "check.expect_ops",
        "opset",
        "dynamo",
        "fallback",
        "attention.promote_opset24",
        "task",  # generation (issue 23)
    )
    needs_model: bool = False
    libraries: tuple[str, ...] = (
        "onnx",
        "onnx-ir",
        "onnxruntime",
        "numpy",
        "ml-dtypes",
        "onnxruntime-genai",
    )
    publish: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = {}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.check.evaluate import evaluate_model
        from hyperexport.contracts.capture_files import read_capture
        from hyperexport.contracts.manifest import ExportManifest
        from hyperexport.stages.check_settings import expectations

        capture = read_capture(inputs.dir("export") / REFERENCE_DIR)
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_JSON).read_text(encoding="utf-8"))
        settings = expectations(params, capture.record.hiera, manifest.fallback_from)
        evaluation = evaluate_model(
            rewrite_dir / MODEL_FILE, manifest, capture.record, capture.arrays, settings
        )
        # The report names the model as published beside it, not this build's scratch copy.
        dataclasses.replace(evaluation, model_path=MODEL_FILE).save(out_dir)
        if params.get("task") == TEXT_GENERATION:  # the decode, in onnxruntime-genai
            from hyperexport.generation.evaluate import evaluate_generation

            evaluate_generation(inputs.dir("trace"), rewrite_dir, out_dir)

"""Stage ``evaluate``: the final model's structural checks and ONNX Runtime runs, untoleranced.

Torch-free: it reads the export's reference capture with numpy, loads the model with onnx_ir and
runs ONNX Runtime. It reads no tolerance, so changing one reruns only ``check``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from hyperexport.config.schema import RecipeConfig, stage_reads
from hyperexport.contracts.names import (
    MANIFEST_JSON,
    MODEL_FILE,
    REFERENCE_DIR,
    TEXT_GENERATION,
)
from hyperexport.engine.stage import StageInputs
from hyperexport.stages.recipe_stage import RecipeStage


class EvaluateStage(RecipeStage):
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
    #: Derived from the schema: the recipe fields that declare "evaluate" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
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

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.check.model_evaluator import evaluate_model
        from hyperexport.contracts.capture_files import read_capture
        from hyperexport.contracts.manifest import ExportManifest
        from hyperexport.from_recipe.check_settings import check_settings

        capture = read_capture(inputs.dir("export") / REFERENCE_DIR)
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_JSON).read_text(encoding="utf-8"))
        settings = check_settings(recipe, capture.record.hiera, manifest.fallback_from)
        evaluation = evaluate_model(
            rewrite_dir / MODEL_FILE, manifest, capture.record, capture.arrays, settings
        )
        # The report names the model as published beside it, not this build's scratch copy.
        dataclasses.replace(evaluation, model_path=MODEL_FILE).save(out_dir)
        if recipe.task == TEXT_GENERATION:  # the decode, in onnxruntime-genai
            from hyperexport.generation.evaluate import evaluate_generation

            evaluate_generation(inputs.dir("trace"), rewrite_dir, out_dir)

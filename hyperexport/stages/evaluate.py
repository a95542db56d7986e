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
from hyperexport.seq2seq.names import GRAPHS, is_seq2seq, manifest_file, model_file
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
        rewrite_dir = inputs.dir("rewrite")
        if is_seq2seq(recipe.task):  # each graph alone, then the decode through both
            from hyperexport.seq2seq.evaluate import evaluate_seq2seq

            for graph in GRAPHS:
                (out_dir / graph).mkdir()
                self._evaluate(
                    recipe,
                    inputs.dir("export") / graph,
                    rewrite_dir / model_file(graph),
                    rewrite_dir / manifest_file(graph),
                    out_dir / graph,
                    model_file(graph),
                )
            evaluate_seq2seq(inputs.dir("trace"), rewrite_dir, out_dir)
            return
        self._evaluate(
            recipe,
            inputs.dir("export"),
            rewrite_dir / MODEL_FILE,
            rewrite_dir / MANIFEST_JSON,
            out_dir,
            MODEL_FILE,
        )
        if recipe.task == TEXT_GENERATION:  # the decode, in onnxruntime-genai
            from hyperexport.generation.evaluate import evaluate_generation

            evaluate_generation(inputs.dir("trace"), rewrite_dir, out_dir)

    def _evaluate(
        self,
        recipe: RecipeConfig,
        export_dir: Path,
        model: Path,
        manifest_path: Path,
        out_dir: Path,
        published: str,
    ) -> None:
        from hyperexport.check.model_evaluator import evaluate_model
        from hyperexport.contracts.capture_files import read_capture
        from hyperexport.contracts.manifest import ExportManifest
        from hyperexport.from_recipe.check_settings import check_settings

        capture = read_capture(export_dir / REFERENCE_DIR)
        manifest = ExportManifest.loads(manifest_path.read_text(encoding="utf-8"))
        settings = check_settings(recipe, capture.record.hiera, manifest.fallback_from)
        evaluation = evaluate_model(model, manifest, capture.record, capture.arrays, settings)
        # The report names the model as published beside it, not this build's scratch copy.
        dataclasses.replace(evaluation, model_path=published).save(out_dir)

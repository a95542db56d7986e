"""Stage ``evaluate``: the published models' structural checks and ONNX Runtime runs, untoleranced.

Torch-free: it reads the export's reference capture with numpy, loads the models with onnx_ir and
runs ONNX Runtime. It reads no tolerance, so changing one reruns only ``check``. What it runs
are the files the build publishes, as the cache holds them: the rewrite's model (and each graph
of the encoder-decoder tasks), the quantize stage's model against it, and the decode with the
trace's ``genai_config.json`` (quantized: the quantize stage's model and config too); it names them by digest (``evaluated.json``,
``stages/judged_files.py``), and the check holds that against what the build publishes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hyperexport.base.contracts.names import (
    EVALUATED_JSON,
    EVALUATION_ARRAYS,
    EVALUATION_JSON,
    MANIFEST_JSON,
    MODEL_FILE,
    NO_QUANTIZATION,
    QUANTIZED_JSON,
    QUANTIZED_MANIFEST_JSON,
    QUANTIZED_MODEL_FILE,
    REFERENCE_DIR,
)
from hyperexport.engine.memory import return_freed_memory
from hyperexport.engine.stage import StageInputs
from hyperexport.library.tasks.registry import task_named
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.judged_files import EXPORT_READS, judged_files, write_evaluated
from hyperexport.product.stages.recipe_stage import RecipeStage

if TYPE_CHECKING:
    from hyperexport.library.check.evaluation import OutputRun
    from hyperexport.library.check.model_evaluator import ModelEvaluator


class EvaluateStage(RecipeStage):
    """``evaluate_model`` → ``evaluation.json`` + ``evaluation.npz`` (``library/check/evaluation.py``);
    with ``quantize.method``, the quantized model against the float one → ``quantized.json``.

    What it finds is judged by the ``check`` stage; a model that runs but is wrong does not fail
    here. A model that cannot be loaded at all does (``CheckError``).
    """

    name: str = "evaluate"
    version: int = 4  # 4: decodes the quantized text-generation model
    #: The reference capture comes from the export (``reference/``): the capture its bundle was
    #: exported from, which after a fallback is not the trace's.
    #: ``trace``: the reference decode and ``genai_config.json`` of ``task: text-generation``;
    #: ``quantize``: the quantized model, run here against the float one.
    upstream: tuple[str, ...] = ("trace", "export", "rewrite", "quantize")
    #: Of the export, only the reference capture (:data:`~.judged_files.EXPORT_READS`).
    upstream_reads: Mapping[str, tuple[str, ...]] = EXPORT_READS
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
    #: The quantized model's comparison, as the check judged it (``check.json`` holds it too).
    publish: tuple[str, ...] = (QUANTIZED_JSON,)

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """The evaluation (once, or per graph), the task's decode, the quantized comparison,
        and ``evaluated.json``."""
        task = task_named(recipe.task)
        evaluation = {"evaluation": EVALUATION_JSON, "evaluation_arrays": EVALUATION_ARRAYS}
        files = {"evaluated": EVALUATED_JSON, **task.per_graph(evaluation)}
        files.update(task.evaluate_files)
        if recipe.quantize.method != NO_QUANTIZATION:
            files.update(quantized_comparison=QUANTIZED_JSON, **task.quantized_evaluate_files)
        return files

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        rewrite_dir = inputs.dir("rewrite")
        task = task_named(recipe.task)
        for graph in task.folders():  # each graph alone
            (out_dir / graph).mkdir(exist_ok=True)
            evaluated = self._evaluate(
                recipe,
                inputs.dir("export") / graph,
                rewrite_dir / task.model_file(graph),
                rewrite_dir / task.manifest_file(graph),
                out_dir / graph,
                task.model_file(graph),
            )
        # Validation refuses quantize.method for the tasks with several graphs.
        if recipe.quantize.method != NO_QUANTIZATION:
            self._compare_quantized(recipe, inputs, out_dir, evaluated)
        # What the evaluation and the comparison freed goes back to the system before the
        # decode maps the weights again (hyperexport/engine/memory.py).
        del evaluated
        return_freed_memory()
        if task.evaluate_files:  # the task's decode of the exported graphs (and quantized)
            from hyperexport.library.tasks.decode import DECODES

            quantized = recipe.quantize.method != NO_QUANTIZATION
            quantize_dir = inputs.dir("quantize") if quantized else None
            DECODES[task.name](inputs.dir("trace"), rewrite_dir, out_dir, quantize_dir)
        write_evaluated(out_dir, judged_files(inputs.digests, task))

    def _evaluate(
        self,
        recipe: RecipeConfig,
        export_dir: Path,
        model: Path,
        manifest_path: Path,
        out_dir: Path,
        published: str,
    ) -> tuple[ModelEvaluator, Sequence[OutputRun]]:
        """Evaluate one model into ``out_dir``; its evaluator and whole-model runs at the traced
        shape (for the quantized comparison to reuse)."""
        from hyperexport.base.contracts.capture_files import read_capture
        from hyperexport.base.contracts.manifest import ExportManifest
        from hyperexport.library.check.evaluation import SECOND_SHAPE
        from hyperexport.library.check.model_evaluator import ModelEvaluator
        from hyperexport.product.from_recipe.check_settings import check_settings

        capture = read_capture(export_dir / REFERENCE_DIR)
        manifest = ExportManifest.loads(manifest_path.read_text(encoding="utf-8"))
        settings = check_settings(recipe, capture.record.hiera, manifest.fallback_from)
        evaluator = ModelEvaluator(model, manifest, capture.record, capture.arrays)
        evaluation = evaluator.evaluate(settings)
        # The report names the model as published beside it, not this build's scratch copy.
        dataclasses.replace(evaluation, model_path=published).save(out_dir)
        return evaluator, [o for o in evaluation.outputs if not o.name.endswith(SECOND_SHAPE)]

    def _compare_quantized(
        self,
        recipe: RecipeConfig,
        inputs: StageInputs,
        out_dir: Path,
        evaluated: tuple[ModelEvaluator, Sequence[OutputRun]],
    ) -> None:
        """The quantize stage's model file against the float one, both in ONNX Runtime, whole
        and every call site alone, on the reference capture's inputs → ``quantized.json``. The
        float model's runs are its evaluation's (``evaluated``), not made twice."""
        from hyperexport.base.contracts.capture_files import read_capture
        from hyperexport.base.contracts.manifest import ExportManifest
        from hyperexport.library.check.quantized import compare_quantized

        def model(folder: Path, name: str, manifest: str) -> tuple[Path, ExportManifest]:
            text = (folder / manifest).read_text(encoding="utf-8")
            return folder / name, ExportManifest.loads(text)

        capture = read_capture(inputs.dir("export") / REFERENCE_DIR)
        comparison = compare_quantized(
            model(inputs.dir("rewrite"), MODEL_FILE, MANIFEST_JSON),
            model(inputs.dir("quantize"), QUANTIZED_MODEL_FILE, QUANTIZED_MANIFEST_JSON),
            capture.record,
            capture.arrays,
            method=recipe.quantize.method,
            block_size=recipe.quantize.block_size,
            evaluated=evaluated,
        )
        comparison.save(out_dir)

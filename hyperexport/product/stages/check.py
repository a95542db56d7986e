"""Stage ``check``: the evaluation judged against the capture, under the recipe's tolerances.

Light: numpy only (``library/check/judge.py``). ONNX Runtime runs here only to localise a failed
whole-model comparison, on the call sites ``evaluate`` did not run.

It vouches for files, by digest: ``check.json``'s ``judged`` names every published file the
evaluation ran (the models, their data and manifests, ``genai_config.json``) with its sha256,
which are upstream digests of this stage's key (``stages/judged_files.py``); an evaluation of
other files than the ones this build publishes fails the check.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import CHECK_JSON, CHECK_SUMMARY, REFERENCE_DIR
from hyperexport.base.errors import CheckError
from hyperexport.engine.stage import StageInputs
from hyperexport.library.tasks.registry import check_published, task_named
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.judged_files import EXPORT_READS, check_evaluated, judged_files
from hyperexport.product.stages.recipe_stage import RecipeStage

if TYPE_CHECKING:
    import numpy as np

    from hyperexport.library.check.evaluation import FunctionRun
    from hyperexport.library.check.judge import CheckReport
    from hyperexport.library.check.model_evaluator import ModelEvaluator
    from hyperexport.library.check.quantized_judge import QuantizedVerdict


class CheckStage(RecipeStage):
    """``judge`` → ``check.json`` and ``check.txt``; a failed check fails the build.

    The check's outputs are written before it raises, so the report can show them; the runner
    never caches a failed stage. The settings are :func:`~hyperexport.product.from_recipe.check_settings.
    check_settings` of its slice.
    """

    name: str = "check"
    version: int = 7  # 7: judges the quantized text-generation model's decode
    #: ``trace``: the reference decode and ``genai_config.json`` of ``task: text-generation``;
    #: ``rewrite``, ``quantize``: the published models, which it names by these digests.
    upstream: tuple[str, ...] = ("trace", "export", "rewrite", "quantize", "evaluate")
    #: Of the export, only the reference capture (:data:`~.judged_files.EXPORT_READS`).
    upstream_reads: Mapping[str, tuple[str, ...]] = EXPORT_READS
    #: Derived from the schema: the recipe fields that declare "check" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
    needs_model: bool = False
    #: numpy judges; the ONNX libraries run only for localisation, and then shape the result.
    libraries: tuple[str, ...] = ("numpy", "ml-dtypes", "onnx", "onnx-ir", "onnxruntime")
    #: Every task's judgement of its decode (``generation_check.json``, ``seq2seq_check.json``).
    publish: tuple[str, ...] = (CHECK_JSON, CHECK_SUMMARY, *check_published())

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """The report and its summary, and the task's judgement of its decode."""
        return {
            "check": CHECK_JSON,
            "check_summary": CHECK_SUMMARY,
            **task_named(recipe.task).check_files,
        }

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        rewrite_dir = inputs.dir("rewrite")
        task = task_named(recipe.task)
        # Graph outputs and capture keys of every graph: what check.accept_vacuous may name.
        known: tuple[list[str], set[str]] = ([], set())
        reports = [  # each graph judged alone
            self._judge(
                recipe,
                known,
                inputs.dir("export") / graph,
                rewrite_dir / task.model_file(graph),
                rewrite_dir / task.manifest_file(graph),
                inputs.dir("evaluate") / graph,
            )
            for graph in task.folders()
        ]
        if task.graphs:  # one report of the graphs (names prefixed with the graph)
            from hyperexport.library.tasks.judge import merge_reports

            data = merge_reports(dict(zip(task.graphs, (r.to_json() for r in reports))))
            lines = [
                f"{graph}: {line}"
                for graph, r in zip(task.graphs, reports)
                for line in r.summary_lines()
            ]
        else:
            data, lines = reports[0].to_json(), reports[0].summary_lines()
        _refuse_unknown_outputs(inputs.source, recipe.check.accept_vacuous, *known)
        # quantize (issue 26): the quantized model against the float one, when there is one.
        quantized = _quantized_verdict(inputs.dir("evaluate"), recipe)
        if quantized is not None:
            data["quantized"] = quantized.to_json()
            lines = [*lines, *quantized.summary_lines()]
        # The published files the evaluation ran: named by the digests this stage's key covers.
        judged = judged_files(inputs.digests, task)
        errors = [check_evaluated(inputs.dir("evaluate"), judged)]
        data["judged"] = judged
        judge = None
        quantized_decode_error: Exception | None = None
        if task.check_files:  # the task judges its decode (and vouches for what it read)
            from hyperexport.library.tasks.judge import JUDGES

            judge = JUDGES[task.name]
            vouched = judge.vouch(inputs.dir("trace"), inputs.dir("quantize"))
            data.update(vouched.report)
            lines = [*lines, *vouched.lines]
            errors.append(CheckError("; ".join(vouched.problems)) if vouched.problems else None)
            if quantized is not None:  # the quantized model's decode against the float one
                from hyperexport.product.from_recipe.check_settings import quantized_decode_gates

                decoded_q = judge.judge_quantized(
                    inputs.dir("evaluate"), quantized_decode_gates(recipe)
                )
                if decoded_q is not None:
                    data["quantized"]["decode"] = decoded_q.report
                    lines = [*lines, *decoded_q.lines]
                    quantized_decode_error = decoded_q.error
        lines = [*lines, *(f"judged {name}: sha256 {digest}" for name, digest in judged.items())]
        text = json.dumps(data, sort_keys=True, indent=1) + "\n"
        atomic_write_bytes(out_dir / CHECK_JSON, text.encode("utf-8"))
        decode_error = None
        if judge is not None:  # the decode, token for token, and its logits
            decoded, decode_error = judge.judge(
                inputs.dir("trace"),
                inputs.dir("evaluate"),
                out_dir,
                recipe.check.generation.min_distinct,
            )
            lines = [*lines, *decoded]
        atomic_write_bytes(out_dir / CHECK_SUMMARY, ("\n".join(lines) + "\n").encode("utf-8"))
        for error in errors:  # what the check would vouch for is not what it judged
            if error is not None:
                raise error
        for report in reports:
            report.raise_for_failure()
        if decode_error is not None:
            raise decode_error
        if quantized is not None:
            quantized.raise_for_failure()
        if quantized_decode_error is not None:
            raise quantized_decode_error

    def _judge(
        self,
        recipe: RecipeConfig,
        known: tuple[list[str], set[str]],
        export_dir: Path,
        model: Path,
        manifest_path: Path,
        evaluate_dir: Path,
    ) -> CheckReport:
        """One graph's evaluation judged against its capture (its output names and capture keys
        added to ``known``)."""
        from hyperexport.base.contracts.capture_files import read_capture
        from hyperexport.base.contracts.manifest import ExportManifest
        from hyperexport.library.check.evaluation import SECOND_SHAPE, Evaluation
        from hyperexport.library.check.judge import judge
        from hyperexport.library.check.tensors import CapturedArrays
        from hyperexport.product.from_recipe.check_settings import check_settings

        capture = read_capture(export_dir / REFERENCE_DIR)
        manifest = ExportManifest.loads(manifest_path.read_text(encoding="utf-8"))
        evaluation = Evaluation.load(evaluate_dir)
        settings = check_settings(recipe, capture.record.hiera, manifest.fallback_from)
        outputs = [o.name.removesuffix(SECOND_SHAPE) for o in evaluation.outputs]
        known[0].extend(outputs)
        known[1].update(outputs, capture.arrays)
        evaluator: ModelEvaluator | None = None

        def run_more(indices: Sequence[int]) -> tuple[list[FunctionRun], dict[str, np.ndarray]]:
            nonlocal evaluator
            if evaluator is None:  # loaded only when a failed comparison needs localising
                from hyperexport.library.check.model_evaluator import ModelEvaluator

                evaluator = ModelEvaluator(model, manifest, capture.record, capture.arrays)
            return evaluator.run_functions(indices, "localisation"), evaluator.computed

        reference = CapturedArrays(capture.record, capture.arrays)
        return judge(evaluation, manifest, capture.record, reference, settings, run_more)


def _refuse_unknown_outputs(
    recipe_file: str, names: Sequence[str], outputs: list[str], known: set[str]
) -> None:
    """RecipeError naming the ``check.accept_vacuous`` entry that is no output or capture key
    of any of the build's graphs."""
    from hyperexport.base.errors import RecipeError

    for i, name in enumerate(names):
        if not any(fnmatch.fnmatchcase(k, name) for k in known):
            raise RecipeError(
                recipe_file,
                f"check.accept_vacuous[{i}]",
                f"{name!r} names no graph output or capture key of this model "
                f"(graph outputs: {', '.join(dict.fromkeys(outputs)) or 'none'})",
            )


def _quantized_verdict(evaluate_dir: Path, recipe: RecipeConfig) -> QuantizedVerdict | None:
    """``check.quantized.*`` applied to the evaluate stage's comparison of the quantized model
    with the float one (None: not quantized)."""
    from hyperexport.library.check.quantized_judge import judge_quantized
    from hyperexport.library.check.quantized_record import QuantizedComparison
    from hyperexport.product.from_recipe.check_settings import quantized_thresholds

    comparison = QuantizedComparison.load(evaluate_dir)
    if comparison is None:
        return None
    return judge_quantized(comparison, quantized_thresholds(recipe))

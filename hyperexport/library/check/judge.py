"""Judge an evaluation: every computed array against torch's reference, under the tolerances.

The cheap half of the check (see ``evaluation.py``): numpy only, no ONNX library, no model
load. When the whole-model comparison fails (or was skipped) and some call sites were not run,
the divergence is localised by running them in execution order; ``run_more`` does that, and only
then is anything loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import CheckError
from hyperexport.library.check.call_plan import class_names, first_divergent, nested_calls
from hyperexport.library.check.compare import compare_arrays
from hyperexport.library.check.evaluation import SECOND_SHAPE, Evaluation, FunctionRun, OutputRun
from hyperexport.library.check.precision import floored
from hyperexport.library.check.results import CheckReport, FunctionResult, TensorResult
from hyperexport.library.check.settings import CheckSettings, Tolerance
from hyperexport.library.check.tensors import CapturedArrays
from hyperexport.library.check.vacuous import exact_constant, vacuous_reason

logger = logging.getLogger(__name__)

#: Runs more call sites (manifest indices) for localisation: their runs and computed arrays.
RunMore = Callable[[Sequence[int]], tuple[Sequence[FunctionRun], dict[str, np.ndarray]]]


class _Judge:
    def __init__(
        self,
        evaluation: Evaluation,
        manifest: ExportManifest,
        reference: CapturedArrays,
        settings: CheckSettings,
    ) -> None:
        self._manifest = manifest
        self._reference = reference
        self._settings = settings
        self._classes = class_names(manifest)
        self.computed = dict(evaluation.arrays)

    def tensor(self, run: OutputRun, *names: str) -> TensorResult:
        """``run`` against its reference; the tolerance is the first override ``names`` match.

        A reference that proves nothing (``vacuous.py``) fails the result unless one of
        ``names`` is in the settings' ``accept_vacuous``.
        """
        expected = self._reference.get(run.key)
        tolerance = self._settings.tolerance_for(*names)
        floor = Tolerance(*floored(tolerance.atol, tolerance.rtol, expected))
        result = compare_arrays(
            self.computed[run.array], expected, floor, name=run.name, key=run.key
        )
        reason = vacuous_reason(expected, floor)
        if reason is None:
            return result
        accepted = self._settings.accepts_vacuous(*names)
        return dataclasses.replace(
            result, ok=result.ok and accepted, vacuous=reason, accepted=accepted
        )

    def by_equality(
        self, results: Sequence[TensorResult], runs: Sequence[OutputRun]
    ) -> tuple[TensorResult, ...]:
        """``results`` (siblings: one call's outputs, or the graph's) with each refused constant
        reference judged by equality (``vacuous.py``, "constant by design"), when a sibling
        proves something."""
        proven = any(r.ok and r.vacuous is None for r in results)
        if not proven:
            return tuple(results)
        out = []
        for result, run in zip(results, runs, strict=True):
            if result.vacuous is not None and not result.ok and not result.diverges:
                expected = self._reference.get(run.key)
                exact = exact_constant(expected, self.computed[run.array])
                if exact is not None:
                    result = dataclasses.replace(result, ok=True, vacuous=exact, exact=True)
            out.append(result)
        return tuple(out)

    def function(self, run: FunctionRun) -> FunctionResult:
        sites = self._manifest.calls
        if not 0 <= run.index < len(sites) or sites[run.index].call_id != run.call_id:
            raise CheckError(f"the evaluation's call {run.call_id!r} is not in the manifest")
        site = sites[run.index]
        outputs: tuple[TensorResult, ...] = ()
        error = run.error
        if error is None:
            try:
                outputs = self.by_equality(
                    [self.tensor(o, o.key) for o in run.outputs], run.outputs
                )
            except CheckError as e:
                error = str(e)
        result = FunctionResult(
            call_id=site.call_id,
            module_path=site.module_path,
            class_name=self._classes.get((site.domain, site.name), ""),
            domain=site.domain,
            function=site.name,
            ok=error is None and all(o.ok for o in outputs),
            outputs=outputs,
            error=error,
            reason=run.reason,
            seconds=run.seconds,
        )
        logger.debug("function %s", result.describe())
        return result


def judge(
    evaluation: Evaluation,
    manifest: ExportManifest,
    capture: CaptureRecord,
    arrays: CapturedArrays,
    settings: CheckSettings,
    run_more: RunMore | None = None,
) -> CheckReport:
    """The check report of an evaluation under ``settings``' tolerances.

    Args:
        evaluation: What ONNX Runtime computed (``model_evaluator.py``).
        manifest: The export manifest the model was evaluated with.
        capture: The capture record (nesting of the calls).
        arrays: The captured reference arrays.
        settings: Tolerances, with per-output overrides by output name or capture key.
        run_more: Runs call sites the evaluation did not, to localise a failed (or skipped)
            whole-model comparison; None leaves them unchecked.

    Returns:
        The report; call ``raise_for_failure()`` to turn a failure into a ``CheckError``.
    """
    start = time.perf_counter()
    j = _Judge(evaluation, manifest, arrays, settings)
    outputs: list[TensorResult] = []
    judged: list[OutputRun] = []
    error = evaluation.end_to_end_error
    for run in evaluation.outputs:
        try:
            outputs.append(j.tensor(run, run.name.removesuffix(SECOND_SHAPE), run.key))
            judged.append(run)
        except CheckError as e:
            error = str(e)
    outputs = list(j.by_equality(outputs, judged))
    results = {r.index: j.function(r) for r in evaluation.functions}
    e2e_failed = (
        evaluation.end_to_end_skipped is not None
        or error is not None
        or any(o.diverges for o in outputs)  # a refused vacuous output needs no localising
    )

    def localise(index: int) -> FunctionResult | None:
        if index not in results and e2e_failed and run_more is not None:
            runs, computed = run_more([index])
            j.computed.update(computed)
            results[index] = j.function(runs[0])
        return results.get(index)

    order = list(range(len(manifest.calls)))
    guilty = first_divergent(order, localise, nested_calls(manifest, capture))
    timings = dict(evaluation.timings)
    timings["judge"] = time.perf_counter() - start
    report = CheckReport(
        model_path=evaluation.model_path,
        settings=settings,
        structural=evaluation.structural,
        outputs=tuple(outputs),
        end_to_end_error=error,
        end_to_end_skipped=evaluation.end_to_end_skipped,
        functions=tuple(results[i] for i in sorted(results)),
        unchecked_calls=tuple(manifest.calls[i].call_id for i in order if i not in results),
        first_divergent_module=None if guilty is None else manifest.calls[guilty].module_path,
        first_divergent_call=None if guilty is None else manifest.calls[guilty].call_id,
        timings=tuple(timings.items()),
    )
    logger.info(
        "check %s: %s (%d functions checked, %d ORT sessions)",
        evaluation.model_path.rsplit("/", 1)[-1],
        "passed" if report.ok else "FAILED",
        len(report.functions),
        evaluation.sessions_built,
    )
    return report

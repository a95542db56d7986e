"""Evaluate the final model: structural checks, then ONNX Runtime on the captured inputs.

The expensive half of the check (see ``evaluation.py``): it loads the model with onnx_ir, runs
the structural checks, the whole model (unless the memory estimate says it cannot fit) and each
call site that ``function_scope`` selects, and records what they computed. No tolerance is read
here; ``judge.py`` applies them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx_ir as ir
from google.protobuf.message import DecodeError

from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import CheckError
from hyperexport.library.check.call_plan import select_calls
from hyperexport.library.check.evaluation import Evaluation, FunctionRun, OutputRun
from hyperexport.library.check.function_runs import FunctionRunner
from hyperexport.library.check.memory import end_to_end_skip_reason
from hyperexport.library.check.settings import CheckSettings
from hyperexport.library.check.structure import check_structure
from hyperexport.library.check.tensors import CapturedArrays
from hyperexport.library.check.whole_model_runs import run_end_to_end
from hyperexport.library.model_file import load_model

logger = logging.getLogger(__name__)


def _load(model_path: Path) -> ir.Model:
    try:
        return load_model(model_path)
    except (OSError, DecodeError) as e:
        raise CheckError(f"cannot load {model_path}: {e}") from e


class ModelEvaluator:
    """One loaded model, evaluated once and able to run more call sites on demand.

    Args:
        model_path: The final model file (external data beside it is followed).
        manifest: The export manifest written with the model.
        capture: The capture record (dtypes of the arrays).
        arrays: The captured tensors, by capture key.

    Raises:
        CheckError: When the model file cannot be read at all.
    """

    def __init__(
        self,
        model_path: Path,
        manifest: ExportManifest,
        capture: CaptureRecord,
        arrays: Mapping[str, np.ndarray],
    ) -> None:
        self.model_path = Path(model_path).absolute()  # not resolve(): a link stays a link
        self._manifest = manifest
        self._captured = CapturedArrays(capture, arrays)
        self._model = _load(self.model_path)
        self.computed: dict[str, np.ndarray] = {}
        # Standalone models are loaded from bytes: relative external-data locations
        # (initializers and function Constant attributes alike) resolve against the model's
        # directory.
        self._functions = FunctionRunner(
            self._model, manifest, self._captured, self.computed, self.model_path.parent
        )

    def evaluate(self, settings: CheckSettings) -> Evaluation:
        """Structure, the whole model and the call sites ``settings.function_scope`` selects.

        Only the structural expectations and ``function_scope`` of ``settings`` are read.
        """
        timings: list[tuple[str, float]] = []
        start = time.perf_counter()
        structural = check_structure(self.model_path, self._model, self._manifest, settings)
        timings.append(("structure", time.perf_counter() - start))

        start = time.perf_counter()
        outputs: tuple[OutputRun, ...] = ()
        error: str | None = None
        skipped = end_to_end_skip_reason(self._model)
        if skipped is not None:
            logger.warning("end-to-end comparison skipped: %s", skipped)
        else:
            try:
                outputs = self._end_to_end()
            except CheckError as e:
                error = str(e)
        timings.append(("end_to_end", time.perf_counter() - start))

        start = time.perf_counter()
        self._functions.run_all(select_calls(self._manifest, settings.function_scope), "scope")
        timings.append(("functions", time.perf_counter() - start))
        return Evaluation(
            model_path=str(self.model_path),
            structural=structural,
            outputs=outputs,
            end_to_end_error=error,
            end_to_end_skipped=skipped,
            functions=self.function_runs(),
            sessions_built=self._functions.sessions_built,
            timings=tuple(timings),
            arrays=self.computed,
        )

    def run_functions(self, indices: Iterable[int], reason: str) -> list[FunctionRun]:
        """Run more call sites (those already run are not run again); their runs, in order."""
        indices = list(indices)
        self._functions.run_all(indices, reason)
        return [self._functions.runs[i] for i in indices]

    def function_runs(self) -> tuple[FunctionRun, ...]:
        """Every call site run so far, in execution order."""
        runs = self._functions.runs
        return tuple(runs[i] for i in sorted(runs))

    def _end_to_end(self) -> tuple[OutputRun, ...]:
        return run_end_to_end(
            self.model_path,
            self._manifest,
            self._captured,
            self.computed,
            probe_shape=True,
            model=self._model,
        )


def evaluate_model(
    model_path: Path,
    manifest: ExportManifest,
    capture: CaptureRecord,
    arrays: Mapping[str, np.ndarray],
    settings: CheckSettings,
) -> Evaluation:
    """:meth:`ModelEvaluator.evaluate` of a model file, in one call."""
    return ModelEvaluator(model_path, manifest, capture, arrays).evaluate(settings)

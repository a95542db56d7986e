"""``run_checks``: structural checks, end-to-end parity, per-function parity, one report."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx_ir as ir
from google.protobuf.message import DecodeError

from hyperexport.check.function_parity import (
    FunctionChecker,
    first_divergent,
    nested_calls,
    select_calls,
)
from hyperexport.check.memory import end_to_end_skip_reason
from hyperexport.check.parity import check_end_to_end
from hyperexport.check.report import CheckReport, TensorResult
from hyperexport.check.settings import CheckSettings
from hyperexport.check.structure import check_structure
from hyperexport.check.tensors import CapturedArrays
from hyperexport.contracts.manifest import ExportManifest
from hyperexport.contracts.records import CaptureRecord
from hyperexport.errors import CheckError

logger = logging.getLogger(__name__)


def _load(model_path: Path) -> ir.Model:
    try:
        return ir.load(model_path)
    except (OSError, DecodeError) as e:
        raise CheckError(f"cannot load {model_path}: {e}") from e


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
    torch is needed.

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
    model_path = Path(model_path).resolve()
    timings: list[tuple[str, float]] = []
    start = time.perf_counter()
    model = _load(model_path)
    captured = CapturedArrays(capture, arrays)
    structural = check_structure(model_path, model, manifest, settings)
    timings.append(("structure", time.perf_counter() - start))

    start = time.perf_counter()
    outputs: tuple[TensorResult, ...] = ()
    e2e_error: str | None = None
    e2e_skipped = end_to_end_skip_reason(model)
    if e2e_skipped is not None:
        logger.warning("end-to-end comparison skipped: %s", e2e_skipped)
    else:
        try:
            outputs = check_end_to_end(model_path, manifest, captured, settings, model=model)
            if manifest.probe_inputs:
                outputs += check_end_to_end(
                    model_path, manifest, captured, settings, second_shape=True, model=model
                )
        except CheckError as e:
            e2e_error = str(e)
    # A skipped comparison checks every function, as a failed one does, to localise or clear.
    e2e_failed = e2e_skipped is not None or e2e_error is not None or not all(o.ok for o in outputs)
    timings.append(("end_to_end", time.perf_counter() - start))

    start = time.perf_counter()
    # Standalone models are loaded from bytes: relative external-data locations (initializers
    # and function Constant attributes alike) must resolve against the model's directory.
    checker = FunctionChecker(model, manifest, captured, settings, model_path.parent)
    checker.check(select_calls(manifest, settings.function_scope), reason="scope")
    order = list(range(len(manifest.calls)))
    get = checker.get if e2e_failed else checker.results.get
    guilty = first_divergent(order, get, nested_calls(manifest, capture))
    timings.append(("functions", time.perf_counter() - start))

    report = CheckReport(
        model_path=str(model_path),
        settings=settings,
        structural=structural,
        outputs=outputs,
        end_to_end_error=e2e_error,
        end_to_end_skipped=e2e_skipped,
        functions=tuple(checker.results[i] for i in sorted(checker.results)),
        unchecked_calls=tuple(manifest.calls[i].call_id for i in order if i not in checker.results),
        first_divergent_module=None if guilty is None else manifest.calls[guilty].module_path,
        first_divergent_call=None if guilty is None else manifest.calls[guilty].call_id,
        timings=tuple(timings),
    )
    logger.info(
        "check %s: %s (%d functions checked with %d sessions, %.2fs)",
        model_path.name,
        "passed" if report.ok else "FAILED",
        len(report.functions),
        checker.sessions_built,
        sum(t for _, t in timings),
    )
    return report

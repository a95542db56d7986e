"""Export units on one path, and with ``options.fallback`` retry once on the other path."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_text
from hyperexport.capture.hooks import Capture
from hyperexport.contracts.bundle import BUNDLE_JSON, ExportBundle
from hyperexport.errors import InputError, ModuleExportError
from hyperexport.export.units import export_units
from hyperexport.options import ExportOptions

log = logging.getLogger(__name__)


def export_units_with_fallback(
    model: Any,
    capture: Capture,
    *,
    opset: int,
    dynamo: bool,
    options: ExportOptions,
    out_dir: Path,
    input_names: tuple[str, ...] | None = None,
    output_names: tuple[str, ...] | None = None,
    recapture: Callable[[bool], Capture] | None = None,
) -> tuple[ExportBundle, Capture]:
    """:func:`export_units`, retried once on the other path if ``options.fallback`` allows it.

    What a capture records depends on the path (the TorchScript path captures under
    ``torch.jit.trace``), so the retry first captures again for the other path with
    ``recapture(dynamo)``; the capture the export used is returned with the bundle, and the
    bundle's copy of the record is that capture's.

    Only an export failure falls back: :class:`ModuleExportError` (torch.onnx.export failed) or
    :class:`InputError` (the path cannot take these inputs, e.g. dynamic axes through
    placeholders on the dynamo path). The fallback is logged at WARNING with its cause, and
    ``bundle.fallback_from`` (hence the model's metadata and the manifest) records it.

    Args:
        model: The live model.
        capture: Its capture.
        opset: Default-domain opset of the export.
        dynamo: The export path tried first.
        options: Export options; ``options.fallback`` enables the retry.
        out_dir: The bundle directory (a failed attempt's unit files are removed before the
            retry).
        input_names: Names of the flattened root inputs, if given by the user.
        output_names: Names of the flattened root outputs, if given by the user.
        recapture: Captures the model for a given path; without it the retry reuses
            ``capture`` (fine for models whose forward does not depend on tracing).

    Returns:
        The bundle, and the capture it was exported from.

    Raises:
        ModuleExportError: The export failed; with fallback, on both paths (the retry's error,
            whose ``__cause__`` is the first path's).
        InputError: The inputs cannot be exported on the path(s) tried.
    """
    kwargs: dict[str, Any] = {
        "opset": opset,
        "options": options,
        "out_dir": out_dir,
        "input_names": input_names,
        "output_names": output_names,
    }
    try:
        return export_units(model, capture, dynamo=dynamo, **kwargs), capture
    except (ModuleExportError, InputError) as e:
        if not options.fallback:
            raise
        log.warning(
            "export with dynamo=%s failed (%s); falling back to dynamo=%s as asked",
            dynamo,
            e,
            not dynamo,
        )
        first = e
    units = out_dir / "units"
    if units.is_dir():
        shutil.rmtree(units)
    try:
        if recapture is not None:
            capture = recapture(not dynamo)
        bundle = export_units(model, capture, dynamo=not dynamo, **kwargs)
    except (ModuleExportError, InputError) as e:
        raise e from first
    bundle = replace(bundle, fallback_from=f"dynamo={dynamo}: {type(first).__name__}: {first}")
    atomic_write_text(out_dir / BUNDLE_JSON, bundle.dumps())
    return bundle, capture

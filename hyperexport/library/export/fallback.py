"""The export with its fallback: retried once on the other path, on a capture made for it.

What a capture records depends on the path (the TorchScript path captures under
``torch.jit.trace``), so the retry first captures again for the other path. The fallback
belongs to the export step: the caller captures once, exports once (this module), composes
once and saves once.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.contracts.bundle import BUNDLE_JSON, ExportBundle
from hyperexport.base.contracts.capture_spec import CaptureSpec
from hyperexport.base.contracts.names import UNITS_DIR
from hyperexport.base.errors import InputError, ModuleExportError
from hyperexport.library.capture.container import Capture
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.registry import other_path, path_for
from hyperexport.library.export.units import SourcesSink, export_units
from hyperexport.library.export.weights import Locator
from hyperexport.library.options import ExportOptions

log = logging.getLogger(__name__)

#: Captures the model for a given export path (the fallback's re-capture).
Recapture = Callable[[ExportPath], Capture]


@dataclass(frozen=True)
class CaptureCall:
    """One model captured from its frozen specification, for any path (first try and fallback).

    The export stage's fallback and ``export_hyper_onnx`` capture through this; the trace stage
    calls ``capture_model`` with the same ``spec.capture_settings()`` (it imports no export code).

    Attributes:
        model: The live model.
        args: Positional example inputs.
        kwargs: Keyword example inputs.
        spec: What the capture runs (method, attention, dynamic axes, probe shapes).
        hiera: The live classes of ``spec.hiera`` (imported by the caller, never from data).
    """

    model: torch.nn.Module
    args: Any
    kwargs: Mapping[str, Any] | None
    spec: CaptureSpec
    hiera: tuple[type, ...]

    def __call__(self, path: ExportPath) -> Capture:
        """The model captured as ``path`` will export it."""
        settings = self.spec.capture_settings()
        return path.capture(self.model, self.args, self.kwargs, hiera=self.hiera, **settings)


def export_with_fallback(
    model: torch.nn.Module,
    capture: Capture,
    *,
    path: ExportPath,
    opset: int,
    options: ExportOptions,
    out_dir: Path,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    recapture: Recapture | None = None,
    locate: Locator | None = None,
    declare_sources: SourcesSink | None = None,
) -> tuple[ExportBundle, Capture]:
    """:func:`export_units` on ``path``, retried once on the other path if ``options.fallback``.

    Only an export failure falls back: :class:`ModuleExportError` (torch.onnx.export failed) or
    :class:`InputError` (the path cannot take these inputs, e.g. dynamic axes through
    placeholders on the dynamo path). The fallback is logged at WARNING with its cause, and
    ``bundle.fallback_from`` (hence the model's metadata and the manifest) records it.

    Args:
        model: The live model.
        capture: Its capture for ``path``.
        path: The export path tried first.
        opset: Default-domain opset of the export.
        options: Export options; ``options.fallback`` enables the retry.
        out_dir: The bundle directory (a failed attempt's unit files are removed before the
            retry).
        input_names: Names of the flattened root inputs, if given by the user.
        output_names: Names of the flattened root outputs, if given by the user.
        recapture: Captures the model for the retry's path (e.g. a :class:`CaptureCall`);
            without it the retry reuses ``capture`` (fine for models whose forward does not
            depend on tracing).
        locate: Places the weights in the files they were loaded from (:func:`export_units`).
        declare_sources: Receives the weight file's sources when every tensor was placed.

    Returns:
        The bundle, and the capture it was exported from (the bundle's copy of the record is
        that capture's).

    Raises:
        ModuleExportError: The export failed; with fallback, on both paths (the retry's error,
            whose ``__cause__`` is the first path's).
        InputError: The inputs cannot be exported on the path(s) tried.
    """
    kwargs: dict[str, Any] = {
        "opset": opset,
        "options": options,
        "out_dir": out_dir,
        "input_names": tuple(input_names) if input_names else None,
        "output_names": tuple(output_names) if output_names else None,
        "locate": locate,
        "declare_sources": declare_sources,
    }
    try:
        return export_units(model, capture, dynamo=path.dynamo, **kwargs), capture
    except (ModuleExportError, InputError) as e:
        if not options.fallback:
            raise
        retry = other_path(path)
        log.warning(
            "export with %s failed (%s); falling back to %s as asked", path.label, e, retry.label
        )
        first = e
    units = out_dir / UNITS_DIR
    if units.is_dir():
        shutil.rmtree(units)
    try:
        if recapture is not None:
            capture = recapture(retry)
        bundle = export_units(model, capture, dynamo=retry.dynamo, **kwargs)
    except (ModuleExportError, InputError) as e:
        raise e from first
    bundle = replace(bundle, fallback_from=f"{path.label}: {type(first).__name__}: {first}")
    atomic_write_text(out_dir / BUNDLE_JSON, bundle.dumps())
    return bundle, capture


def export_units_with_fallback(
    model: torch.nn.Module,
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
    """Deprecated: :func:`export_with_fallback` with ``path=path_for(dynamo)``, the one fallback
    entry, whose ``recapture`` takes the :class:`ExportPath`.

    ``recapture(dynamo)`` captures the model for the retry's path; see
    :func:`export_with_fallback` for the rest.
    """
    warnings.warn(
        "export_units_with_fallback is deprecated; call export_with_fallback(path=path_for(dynamo))",
        DeprecationWarning,
        stacklevel=2,
    )
    again = None if recapture is None else (lambda path: recapture(path.dynamo))
    return export_with_fallback(
        model,
        capture,
        path=path_for(dynamo),
        opset=opset,
        options=options,
        out_dir=out_dir,
        input_names=input_names,
        output_names=output_names,
        recapture=again,
    )

"""Stage ``export``: export each hierarchy unit to ONNX (``bundle.json`` + ``units/*.onnx``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.runner.stage import StageInputs

#: Where the export stage keeps the capture it re-made for the other path after a fallback.
FALLBACK_CAPTURE = "fallback_capture"


class ExportStage:
    """``export_units`` on the live model and the trace's capture.

    With ``fallback: true`` a failed export is retried once on the other path (logged at
    WARNING) on a capture re-made for that path (saved under ``fallback_capture/``, which the
    check stage then compares against); ``bundle.json`` records it, and from there the model's
    metadata and the report.
    """

    name: str = "export"
    version: int = 3
    upstream: tuple[str, ...] = ("trace",)
    reads: tuple[str, ...] = (
        "model",
        "inputs",
        "hiera",
        "method",
        "opset",
        "dynamo",
        "fallback",
        "functions",
        "custom_ops",
        "attention",
    )
    needs_model: bool = True
    publish: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = {"bundle": "bundle.json"}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.api import Capture, export_units_with_fallback
        from hyperexport.stages.options import export_options

        capture = Capture.load(inputs.dir("trace"))
        model = inputs.model()
        options = export_options(params)
        first = capture

        def recapture(dynamo: bool) -> Capture:
            # The other path's capture semantics (see api.export_units_with_fallback).
            from hyperexport.api import capture_model
            from hyperexport.stages.model import make_inputs, resolve_classes

            return capture_model(
                model,
                (),
                make_inputs(params["inputs"]),
                hiera=resolve_classes(list(params["hiera"]), inputs.recipe_file),
                method=params["method"],
                dynamo=dynamo,
                attention=options.attention.implementation,
                dynamic_axes={k: dict(v) for k, v in options.dynamic_axes} or None,
                probe_shapes={k: tuple(v) for k, v in options.probe_shapes} or None,
            )

        _, used = export_units_with_fallback(
            model,
            capture,
            opset=int(params["opset"]),
            dynamo=bool(params["dynamo"]),
            options=options,
            out_dir=out_dir,
            recapture=recapture,
        )
        if used is not first:
            # The check stage compares against the capture the model was exported from.
            used.save(out_dir / FALLBACK_CAPTURE)

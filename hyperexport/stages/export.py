"""Stage ``export``: export each hierarchy unit to ONNX (``bundle.json`` + ``units/*.onnx``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.build.stage import StageInputs


class ExportStage:
    """``export_units`` on the live model and the trace's capture.

    With ``fallback: true`` a failed export is retried once on the other path (logged at
    WARNING); ``bundle.json`` records it, and from there the model's metadata and the report.
    """

    name: str = "export"
    version: int = 2
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
        export_units_with_fallback(
            inputs.model(),
            capture,
            opset=int(params["opset"]),
            dynamo=bool(params["dynamo"]),
            options=export_options(params),
            out_dir=out_dir,
        )

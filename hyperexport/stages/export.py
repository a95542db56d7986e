"""Stage ``export``: export each hierarchy unit to ONNX (``bundle.json`` + ``units/*.onnx``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.build.stage import StageInputs


class ExportStage:
    """``export_units`` on the live model and the trace's capture."""

    name: str = "export"
    version: int = 1
    upstream: tuple[str, ...] = ("trace",)
    reads: tuple[str, ...] = (
        "model",
        "inputs",
        "hiera",
        "method",
        "opset",
        "dynamo",
        "functions",
        "custom_ops",
        "attention",
    )
    needs_model: bool = True
    publish: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = {"bundle": "bundle.json"}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.api import Capture, export_units
        from hyperexport.stages.options import export_options

        capture = Capture.load(inputs.dir("trace"))
        export_units(
            inputs.model(),
            capture,
            opset=int(params["opset"]),
            dynamo=bool(params["dynamo"]),
            options=export_options(params),
            out_dir=out_dir,
        )

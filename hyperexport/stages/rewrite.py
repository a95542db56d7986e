"""Stage ``rewrite``: compose functions, run the rewrite passes, save the final model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.runner.hashing import atomic_write_bytes
from hyperexport.runner.stage import StageInputs

MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"


class RewriteStage:
    """``compose_model`` on the export bundle → ``model.onnx`` (+ external data) and ``manifest.json``."""

    name: str = "rewrite"
    version: int = 1
    upstream: tuple[str, ...] = ("export",)
    reads: tuple[str, ...] = (
        "functions",
        "rewrite",
        "attention",
        "external_data",
        "external_data_threshold",
    )
    needs_model: bool = False
    publish: tuple[str, ...] = ("model.onnx", "model.onnx.data", "*.onnx.data", MANIFEST_FILE)
    artifacts: Mapping[str, str] = {"model": MODEL_FILE, "manifest": MANIFEST_FILE}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.api import compose_model, save_model
        from hyperexport.stages.options import export_options

        model, manifest = compose_model(inputs.dir("export"), options=export_options(params))
        save_model(
            model,
            out_dir / MODEL_FILE,
            external_data=bool(params["external_data"]),
            threshold=int(params["external_data_threshold"]),
        )
        atomic_write_bytes(out_dir / MANIFEST_FILE, (manifest.dumps() + "\n").encode("utf-8"))

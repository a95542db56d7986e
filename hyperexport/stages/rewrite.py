"""Stage ``rewrite``: compose functions, run the rewrite passes, save the final model (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport import progress
from hyperexport.atomic import atomic_write_bytes
from hyperexport.contracts.names import MANIFEST_JSON, MODEL_FILE
from hyperexport.runner.stage import StageInputs


class RewriteStage:
    """``compose_model`` on the export bundle → ``model.onnx`` (+ external data) and ``manifest.json``."""

    name: str = "rewrite"
    version: int = 2
    upstream: tuple[str, ...] = ("export",)
    reads: tuple[str, ...] = (
        "functions",
        "rewrite",
        "attention",
        "external_data",
        "external_data_threshold",
    )
    needs_model: bool = False
    libraries: tuple[str, ...] = ("onnx", "onnx-ir", "onnxscript")
    publish: tuple[str, ...] = (MODEL_FILE, f"{MODEL_FILE}.data", "*.onnx.data", MANIFEST_JSON)
    artifacts: Mapping[str, str] = {"model": MODEL_FILE, "manifest": MANIFEST_JSON}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.model_file import save_model
        from hyperexport.passes.pipeline import compose_model
        from hyperexport.stages.options import export_options

        model, manifest = compose_model(inputs.dir("export"), options=export_options(params))
        with progress.watch_bytes(out_dir, f"writing {MODEL_FILE}"):
            save_model(
                model,
                out_dir / MODEL_FILE,
                external_data=bool(params["external_data"]),
                threshold=int(params["external_data_threshold"]),
            )
        atomic_write_bytes(out_dir / MANIFEST_JSON, (manifest.dumps() + "\n").encode("utf-8"))

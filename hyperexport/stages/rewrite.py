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
    """``compose_model`` on the export bundle → ``model.onnx`` (+ external data) and ``manifest.json``.

    When no pass made a tensor for the data file, ``model.onnx.data`` is the export's
    ``units/weights.data`` unchanged: the stage writes it as a symlink to that input, which the
    cache records under the input's digest without copying it (``runner/workspace.py``). When
    passes appended tensors, the file is a copy of the weights plus those tensors (logged at
    INFO with its size): a second blob in the cache.
    """

    name: str = "rewrite"
    version: int = 4  # 4: the model records the library versions it was built with
    upstream: tuple[str, ...] = ("export",)
    reads: tuple[str, ...] = (
        "functions",
        "rewrite",
        "attention",
        "external_data",
        "external_data_threshold",
    )
    needs_model: bool = False
    #: torch, transformers and onnxruntime too: their versions go into the model's metadata.
    libraries: tuple[str, ...] = (
        "onnx",
        "onnx-ir",
        "onnxscript",
        "torch",
        "transformers",
        "onnxruntime",
    )
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
                # The export's weight file unchanged: a link the cache stores without a copy.
                link_unchanged=True,
            )
        atomic_write_bytes(out_dir / MANIFEST_JSON, (manifest.dumps() + "\n").encode("utf-8"))

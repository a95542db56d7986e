"""Stage ``export``: export each hierarchy unit to ONNX (``bundle.json`` + ``units/*.onnx``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.contracts.names import BUNDLE_JSON, CAPTURE_JSON, REFERENCE_DIR, TENSORS_NPZ
from hyperexport.runner.stage import StageInputs


class ExportStage:
    """``export_units`` on the live model and the trace's capture.

    Besides the bundle, the stage writes the capture its bundle was exported from under
    ``reference/``: the check stage's reference, so that check reads only its declared inputs.
    It is a copy of the trace's capture (the cache stores its bytes once), or, with
    ``fallback: true`` after a failed export retried on the other path (logged at WARNING), the
    capture re-made for that path; ``bundle.json`` records the fallback, and from there the
    model's metadata and the report.
    """

    name: str = "export"
    version: int = 4
    upstream: tuple[str, ...] = ("trace",)
    reads: tuple[str, ...] = (
        "model",
        "inputs",
        "hiera",
        "dynamic",
        "method",
        "opset",
        "dynamo",
        "fallback",
        "functions",
        "custom_ops",
        # Only the implementation: promotion to opset 24 is the rewrite stage's.
        "attention.implementation",
        "task",  # generation (issue 23): the step model with past/present KV
        "generation",
    )
    needs_model: bool = True
    libraries: tuple[str, ...] = ("torch", "transformers", "onnx", "onnxscript", "onnx-ir")
    publish: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = {"bundle": BUNDLE_JSON}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.generation.task import task_scope

        # task: text-generation runs the step model (past/present KV in and out); forward runs
        # the model as loaded.
        with task_scope(inputs.model(), params, inputs.recipe_file) as (model, params):
            self._run(model, params, inputs, out_dir)

    def _run(
        self, model: Any, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path
    ) -> None:
        from hyperexport.capture.hooks import Capture
        from hyperexport.capture.tree import check_rebuildable
        from hyperexport.export.fallback import export_units_with_fallback
        from hyperexport.models.auto import resolve_auto
        from hyperexport.runner.files import clone_or_copy
        from hyperexport.stages.options import export_options

        capture = Capture.load(inputs.dir("trace"))
        check_rebuildable(capture.record)  # a CorruptRecordError makes the runner rebuild trace
        params = resolve_auto(params, model, inputs.recipe_file)  # hiera/inputs: auto
        options = export_options(params)
        first = capture

        def recapture(dynamo: bool) -> Capture:
            # The other path's capture semantics (see export_units_with_fallback).
            from hyperexport.capture.hooks import capture_model
            from hyperexport.models.inputs import make_inputs
            from hyperexport.stages.model import resolve_classes

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
        reference = out_dir / REFERENCE_DIR
        if used is first:
            reference.mkdir()
            for name in (CAPTURE_JSON, TENSORS_NPZ):
                clone_or_copy(inputs.dir("trace") / name, reference / name)
        else:
            used.save(reference)

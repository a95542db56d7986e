"""Stage ``trace``: run the model once with hooks; write the capture record and its tensors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.contracts.names import CAPTURE_JSON
from hyperexport.generation.names import GENAI_CONFIG, TOKENIZER_FILES
from hyperexport.runner.stage import StageInputs


class TraceStage:
    """``capture_model`` on the recipe's inputs → ``capture.json`` + ``tensors.npz``.

    The capture holds the reference outputs the check stage compares against, so check never
    needs torch. The trace depends on the export path (the TorchScript path captures under
    ``torch.jit.trace``) and on the attention implementation (the model runs with it), but not
    on the opset. With dynamic axes the model runs a second time, at ``check_shape``: those
    outputs are the check stage's references at the second shape.
    """

    name: str = "trace"
    version: int = 3
    upstream: tuple[str, ...] = ()
    reads: tuple[str, ...] = (
        "model",
        "inputs",
        "hiera",
        "dynamic",
        "method",
        "dynamo",
        "attention.implementation",
        "task",  # generation (issue 23)
        "generation",
    )
    needs_model: bool = True
    libraries: tuple[str, ...] = ("torch", "transformers", "numpy")
    #: ``genai_config.json`` and tokenizer files: written for ``task: text-generation`` only.
    publish: tuple[str, ...] = ("auto.json", GENAI_CONFIG, *TOKENIZER_FILES)
    artifacts: Mapping[str, str] = {"capture": CAPTURE_JSON}

    def run(self, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.generation.task import task_scope

        # task: text-generation runs the step model (past/present KV in and out) and records
        # the reference decode; forward runs the model as loaded.
        with task_scope(inputs.model(), params, inputs.recipe_file, out_dir) as (model, params):
            self._run(model, params, inputs, out_dir)

    def _run(
        self, model: Any, params: Mapping[str, Any], inputs: StageInputs, out_dir: Path
    ) -> None:
        from hyperexport.capture.hooks import capture_model
        from hyperexport.models.auto import resolve_auto
        from hyperexport.models.inputs import make_inputs
        from hyperexport.stages.model import resolve_classes
        from hyperexport.stages.options import dynamic_axes, probe_shapes

        params = resolve_auto(params, model, inputs.recipe_file, out_dir)  # hiera/inputs: auto
        hiera = resolve_classes(list(params["hiera"]), inputs.recipe_file)
        axes = {name: dict(a) for name, a in dynamic_axes(params["inputs"])}
        capture = capture_model(
            model,
            (),
            make_inputs(params["inputs"]),
            hiera=hiera,
            method=params["method"],
            dynamo=bool(params["dynamo"]),
            attention=params["attention"]["implementation"],
            dynamic_axes=axes or None,
            probe_shapes=dict(probe_shapes(params["inputs"])) or None,
            strict_hiera=str(inputs.recipe_file),  # a build: a hiera class never run is exit 2
        )
        capture.save(out_dir)

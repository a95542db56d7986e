"""Stage ``trace``: run the model once with hooks; write the capture record and its tensors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.names import AUTO_FILE, CAPTURE_JSON, CAPTURE_SPEC_JSON, TENSORS_NPZ
from hyperexport.engine.stage import StageInputs
from hyperexport.library.tasks.registry import task_named, trace_published
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.recipe_stage import RecipeStage


class TraceStage(RecipeStage):
    """``capture_model`` on the recipe's inputs → ``capture.json`` + ``tensors.npz``, and the
    frozen capture specification it ran (``capture_spec.json``: ``auto`` resolved).

    The capture holds the reference outputs the check stage compares against, so check never
    needs torch. The trace depends on the export path (the TorchScript path captures under
    ``torch.jit.trace``) and on the attention implementation (the model runs with it), but not
    on the opset. With dynamic axes the model runs a second time, at ``check_shape``: those
    outputs are the check stage's references at the second shape.
    """

    name: str = "trace"
    version: int = 4
    upstream: tuple[str, ...] = ()
    #: Derived from the schema: the recipe fields that declare "trace" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
    needs_model: bool = True
    libraries: tuple[str, ...] = ("torch", "transformers", "numpy")
    #: What a task publishes beside the model (``genai_config.json``, tokenizer files).
    publish: tuple[str, ...] = (AUTO_FILE, *trace_published())

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """The capture, its tensors and specification, once or per graph folder (the
        encoder-decoder tasks: ``encoder/``, ``decoder/``), and the task's reference decode
        (:class:`~hyperexport.library.tasks.task.Task` ``trace_files``). ``auto.json`` and the tokenizer
        files depend on the recipe's values and the checkpoint's folder, not on a field alone:
        not declared."""
        task = task_named(recipe.task)
        capture = {
            "capture": CAPTURE_JSON,
            "tensors": TENSORS_NPZ,
            "capture_spec": CAPTURE_SPEC_JSON,
        }
        return {**task.per_graph(capture), **task.trace_files}

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.library.tasks.models import model_part
        from hyperexport.product.config.fields import from_json, to_json

        # The task records what its graphs are judged against (a reference decode), on the
        # model as loaded; then each graph runs as the task scopes it (forward: the model and
        # the slice as they are), into its own folder when there are several.
        part, params = model_part(recipe.task), to_json(recipe)
        part.record(inputs.model(), params, inputs.source, out_dir)
        for graph in task_named(recipe.task).folders():
            with part.scope(inputs.model(), params, inputs.source, graph) as scoped:
                folder = out_dir / graph
                folder.mkdir(exist_ok=True)
                typed = from_json(RecipeConfig, scoped[1], partial=True)
                self._run(scoped[0], typed, inputs, folder)

    def _run(self, model: Any, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.library.capture.capture_model import capture_model
        from hyperexport.library.capture.streaming import streamed_run
        from hyperexport.product.from_recipe.model import resolve_classes
        from hyperexport.product.from_recipe.resolved_capture import capture_spec, example_inputs

        # auto resolved once, here; the export stage captures again from this record only.
        spec = capture_spec(recipe, model, inputs.source, out_dir)
        spec.save(out_dir)
        hiera = resolve_classes(list(spec.hiera), inputs.source)
        # A streamed model (weights: stream) binds each hiera call's weights around it; its
        # hooks go in before the capture's. A loaded model runs as it is.
        with streamed_run(model, hiera):
            capture = capture_model(
                model,
                (),
                example_inputs(spec),
                hiera=hiera,
                dynamo=spec.dynamo,
                strict_hiera=str(inputs.source),  # a build: a hiera class never run is exit 2
                **spec.capture_settings(),
            )
        capture.save(out_dir)

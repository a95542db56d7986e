"""Stage ``rewrite``: compose functions, run the rewrite passes, save the final model (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import MANIFEST_JSON, MODEL_FILE
from hyperexport.engine.stage import StageInputs
from hyperexport.library import progress
from hyperexport.library.tasks.registry import GENERATION_REFERENCE_JSON, TASKS, task_named
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.recipe_stage import RecipeStage

if TYPE_CHECKING:
    from hyperexport.library.model_file import DataFileOrigin


class RewriteStage(RecipeStage):
    """``compose_model`` on the export bundle → ``model.onnx`` (+ external data) and ``manifest.json``.

    When no pass made a tensor for the data file, ``model.onnx.data`` is the export's
    ``units/weights.data`` unchanged: the stage writes it as a symlink to that input, which the
    cache records under the input's digest without copying it (``engine/workspace.py``). When
    passes appended tensors, the file is a copy of the weights plus those tensors (logged at
    INFO with its size): a second blob in the cache.
    """

    name: str = "rewrite"
    # 4: the model records the library versions it was built with; 5: reads task (its graphs);
    # 6: the model is written at the lowest IR version carrying its opsets (model_file.py);
    # 7: a fused generation step's rotary tables, as long as the trace's recorded context
    version: int = 7
    #: ``trace``: the context length of ``task: text-generation`` (``ExportOptions.context_length``).
    upstream: tuple[str, ...] = ("export", "trace")
    upstream_reads: Mapping[str, tuple[str, ...]] = MappingProxyType(
        {"trace": (GENERATION_REFERENCE_JSON,)}
    )
    #: Derived from the schema: the recipe fields that declare "rewrite" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
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
    #: Every task's models: ``model.onnx``, or one per graph (``encoder_model.onnx``, ...).
    publish: tuple[str, ...] = (
        MODEL_FILE,
        f"{MODEL_FILE}.data",
        "*.onnx.data",
        MANIFEST_JSON,
        *dict.fromkeys(
            f(g) for t in TASKS.values() for f in (t.model_file, t.manifest_file) for g in t.graphs
        ),
    )

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """One model and its manifest, or one per graph of the task (``encoder_model.onnx``,
        ...). A data file depends on the weights' sizes: not declared."""
        task = task_named(recipe.task)
        if task.graphs:
            return {
                **{f"{g}_model": task.model_file(g) for g in task.graphs},
                **{f"{g}_manifest": task.manifest_file(g) for g in task.graphs},
            }
        return {"model": MODEL_FILE, "manifest": MANIFEST_JSON}

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.library.model_file import save_model
        from hyperexport.library.passes.pipeline import compose_model
        from hyperexport.library.tasks.genai_config import recorded_context_length
        from hyperexport.product.from_recipe.export_options import export_options

        export_dir = inputs.dir("export")
        options = replace(
            export_options(recipe), context_length=recorded_context_length(inputs.dir("trace"))
        )
        # One bundle per graph folder of the task, each into <graph>_model.onnx +
        # <graph>_manifest.json (Optimum's file names); one graph: model.onnx + manifest.json.
        task = task_named(recipe.task)
        jobs = [(export_dir / g, task.model_file(g), task.manifest_file(g)) for g in task.folders()]
        for bundle_dir, model_name, manifest_name in jobs:
            model, manifest = compose_model(bundle_dir, options=options)
            with progress.watch_bytes(out_dir, f"writing {model_name}"):
                origin = save_model(
                    model,
                    out_dir / model_name,
                    external_data=recipe.external_data,
                    threshold=recipe.external_data_threshold,
                    # The export's weight file unchanged: a link the cache stores without a copy;
                    # appended to: taken over when no later stage reads it, else cloned.
                    link_unchanged=True,
                    take=inputs.take,
                )
            if origin is not None:  # a clone with the passes' tensors appended
                declare_clone(origin, inputs)
            text = (manifest.dumps() + "\n").encode("utf-8")
            atomic_write_bytes(out_dir / manifest_name, text)


def declare_clone(origin: DataFileOrigin, inputs: StageInputs) -> None:
    """Declare a data file that clones the export's (an input) and appends the passes' tensors
    as that input's bytes plus the tail, which the cache's record then holds itself
    (``engine/sourced.py``): the cache stores no second copy of the weights. A tail over what a
    record may hold is not declared (the file is stored as a copy)."""
    from hyperexport.engine.sourced import LITERAL_MAX, FileSources, Piece

    size = origin.path.stat().st_size
    if size - origin.cloned_bytes > LITERAL_MAX:
        return
    with open(origin.path, "rb") as fh:
        fh.seek(origin.cloned_bytes)
        tail = fh.read()
    pieces = [Piece(0, origin.cloned_bytes, origin.cloned, 0)] if origin.cloned_bytes else []
    if tail:
        pieces.append(Piece.literal(origin.cloned_bytes, tail))
    inputs.declare_sources(origin.path, FileSources(size, tuple(pieces)))

"""Stage ``rewrite``: compose functions, run the rewrite passes, save the final model (no torch)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hyperexport import progress
from hyperexport.atomic import atomic_write_bytes
from hyperexport.config.schema import RecipeConfig, stage_reads
from hyperexport.contracts.names import MANIFEST_JSON, MODEL_FILE
from hyperexport.engine.stage import StageInputs
from hyperexport.seq2seq.names import GRAPHS, is_seq2seq, manifest_file, model_file
from hyperexport.stages.recipe_stage import RecipeStage


class RewriteStage(RecipeStage):
    """``compose_model`` on the export bundle → ``model.onnx`` (+ external data) and ``manifest.json``.

    When no pass made a tensor for the data file, ``model.onnx.data`` is the export's
    ``units/weights.data`` unchanged: the stage writes it as a symlink to that input, which the
    cache records under the input's digest without copying it (``engine/workspace.py``). When
    passes appended tensors, the file is a copy of the weights plus those tensors (logged at
    INFO with its size): a second blob in the cache.
    """

    name: str = "rewrite"
    # 4: the model records the library versions it was built with; 5: reads task (its graphs)
    version: int = 5
    upstream: tuple[str, ...] = ("export",)
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
    publish: tuple[str, ...] = (
        MODEL_FILE,
        f"{MODEL_FILE}.data",
        "*.onnx.data",
        MANIFEST_JSON,
        *(model_file(g) for g in GRAPHS),
        *(manifest_file(g) for g in GRAPHS),
    )

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """One model and its manifest, or one per graph of the encoder-decoder tasks
        (``encoder_model.onnx``, ...). A data file depends on the weights' sizes: not declared."""
        if is_seq2seq(recipe.task):
            return {
                **{f"{g}_model": model_file(g) for g in GRAPHS},
                **{f"{g}_manifest": manifest_file(g) for g in GRAPHS},
            }
        return {"model": MODEL_FILE, "manifest": MANIFEST_JSON}

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.from_recipe.export_options import export_options
        from hyperexport.model_file import save_model
        from hyperexport.passes.pipeline import compose_model

        export_dir = inputs.dir("export")
        # The encoder-decoder tasks export one bundle per graph folder: each becomes
        # <graph>_model.onnx + <graph>_manifest.json (Optimum's file names).
        if is_seq2seq(recipe.task):
            jobs = [(export_dir / g, model_file(g), manifest_file(g)) for g in GRAPHS]
        else:
            jobs = [(export_dir, MODEL_FILE, MANIFEST_JSON)]
        for bundle_dir, model_name, manifest_name in jobs:
            model, manifest = compose_model(bundle_dir, options=export_options(recipe))
            with progress.watch_bytes(out_dir, f"writing {model_name}"):
                save_model(
                    model,
                    out_dir / model_name,
                    external_data=recipe.external_data,
                    threshold=recipe.external_data_threshold,
                    # The export's weight file unchanged: a link the cache stores without a copy.
                    link_unchanged=True,
                )
            text = (manifest.dumps() + "\n").encode("utf-8")
            atomic_write_bytes(out_dir / manifest_name, text)

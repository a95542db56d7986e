"""Stage ``trace``: run the model once with hooks; write the capture record and its tensors."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.config.schema import RecipeConfig, stage_reads
from hyperexport.contracts.names import (
    AUTO_FILE,
    CAPTURE_JSON,
    CAPTURE_SPEC_JSON,
    TENSORS_NPZ,
    TEXT_GENERATION,
)
from hyperexport.engine.stage import StageInputs
from hyperexport.generation import names as generation
from hyperexport.generation.names import GENAI_CONFIG, TOKENIZER_FILES
from hyperexport.seq2seq import names as seq2seq
from hyperexport.seq2seq.names import GRAPHS, is_seq2seq
from hyperexport.stages.recipe_stage import RecipeStage


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
    #: ``genai_config.json`` and tokenizer files: written for ``task: text-generation`` only.
    publish: tuple[str, ...] = (AUTO_FILE, GENAI_CONFIG, *TOKENIZER_FILES)

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """The capture, its tensors and specification: once (``forward``, ``text-generation``,
        which adds the reference decode and ``genai_config.json``), or per graph in
        ``encoder/`` and ``decoder/`` beside the reference decode (the encoder-decoder tasks).
        ``auto.json`` and the tokenizer files depend on the recipe's values and the checkpoint's
        folder, not on a field alone: not declared."""
        capture = {
            "capture": CAPTURE_JSON,
            "tensors": TENSORS_NPZ,
            "capture_spec": CAPTURE_SPEC_JSON,
        }
        if is_seq2seq(recipe.task):
            return {
                **{f"{g}_{name}": f"{g}/{rel}" for g in GRAPHS for name, rel in capture.items()},
                "seq2seq_reference": seq2seq.REFERENCE_JSON,
                "seq2seq_reference_arrays": seq2seq.REFERENCE_NPZ,
            }
        if recipe.task == TEXT_GENERATION:
            return {
                **capture,
                "genai_config": GENAI_CONFIG,
                "generation_reference": generation.REFERENCE_JSON,
                "generation_reference_arrays": generation.REFERENCE_NPZ,
            }
        return capture

    def run_recipe(self, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.config.fields import from_json, to_json
        from hyperexport.generation.task import task_scope

        # task: text-generation runs the step model (past/present KV in and out) and records
        # the reference decode; forward runs the model as loaded.
        if is_seq2seq(recipe.task):  # an encoder and a decoder graph, each in its own folder
            from hyperexport.seq2seq.task import graph_scope, record

            params = to_json(recipe)
            record(inputs.model(), params, inputs.recipe_file, out_dir)
            for graph in GRAPHS:
                with graph_scope(inputs.model(), params, inputs.recipe_file, graph) as scoped:
                    (out_dir / graph).mkdir()
                    typed = from_json(RecipeConfig, scoped[1], partial=True)
                    self._run(scoped[0], typed, inputs, out_dir / graph)
            return
        scope = task_scope(inputs.model(), to_json(recipe), inputs.recipe_file, out_dir)
        with scope as (model, params):
            self._run(model, from_json(RecipeConfig, params, partial=True), inputs, out_dir)

    def _run(self, model: Any, recipe: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        from hyperexport.capture.capture_model import capture_model
        from hyperexport.from_recipe.capture_spec import capture_spec, example_inputs
        from hyperexport.from_recipe.model import resolve_classes

        # auto resolved once, here; the export stage captures again from this record only.
        spec = capture_spec(recipe, model, inputs.recipe_file, out_dir)
        spec.save(out_dir)
        capture = capture_model(
            model,
            (),
            example_inputs(spec),
            hiera=resolve_classes(list(spec.hiera), inputs.recipe_file),
            dynamo=spec.dynamo,
            strict_hiera=str(inputs.recipe_file),  # a build: a hiera class never run is exit 2
            **spec.capture_settings(),
        )
        capture.save(out_dir)

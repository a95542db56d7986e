"""Stage ``quantize``: the final model's MatMul weights in int4 or int8, inside the functions.

With ``quantize.method: none`` (the default) it does nothing and writes nothing: the build's
model is the rewrite's, byte for byte. Otherwise it writes the quantized model beside the float
one (``model.quantized.onnx``, its manifest), and for ``task: text-generation`` the
``genai_config.json`` naming it (published in place of the trace's: onnxruntime-genai runs the
quantized model of the folder), and nothing else: the evaluate stage runs the file this stage
wrote, the one the build publishes, against the float model in ONNX Runtime, and the check
judges that. A comparison written here would be a record of a model, and a cache entry can pair
a record with another model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import (
    MANIFEST_JSON,
    MODEL_FILE,
    NO_QUANTIZATION,
    QUANTIZED_MANIFEST_JSON,
    QUANTIZED_MODEL_FILE,
)
from hyperexport.base.errors import RecipeError
from hyperexport.engine.stage import StageInputs
from hyperexport.library.tasks.registry import quantize_published, task_named
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages.recipe_stage import RecipeStage

log = logging.getLogger(__name__)


class QuantizeStage(RecipeStage):
    """``QuantizeMatMulsPass`` on the rewrite's model (compared with it by ``evaluate``)."""

    name: str = "quantize"
    # 3: accuracy_level; genai_config.json of text-generation; 4: written by
    # model_file.save_compact, at the lowest IR version carrying its opsets
    version: int = 4
    #: ``trace``: the model config the quantized ``genai_config.json`` is built from.
    upstream: tuple[str, ...] = ("rewrite", "trace")
    #: Derived from the schema: the recipe fields that declare "quantize" among their readers.
    reads: tuple[str, ...] = stage_reads(name)
    needs_model: bool = False
    libraries: tuple[str, ...] = ("onnx", "onnx-ir", "onnxruntime", "numpy", "ml-dtypes")
    publish: tuple[str, ...] = (
        QUANTIZED_MODEL_FILE,
        f"{QUANTIZED_MODEL_FILE}.data",
        QUANTIZED_MANIFEST_JSON,
        *quantize_published(),
    )

    def recipe_outputs(self, recipe: RecipeConfig) -> Mapping[str, str]:
        """Nothing with ``quantize.method: none``; else the quantized model and its manifest
        (its data file depends on the weights' sizes: not declared), and the task's files."""
        if recipe.quantize.method == NO_QUANTIZATION:
            return {}
        return {
            "quantized_model": QUANTIZED_MODEL_FILE,
            "quantized_manifest": QUANTIZED_MANIFEST_JSON,
            **task_named(recipe.task).quantized_files,
        }

    def run_recipe(self, recipe_config: RecipeConfig, inputs: StageInputs, out_dir: Path) -> None:
        q = recipe_config.quantize
        if q.method == NO_QUANTIZATION:
            return

        from hyperexport.base.contracts.manifest import ExportManifest
        from hyperexport.library.model_file import load_model, save_compact
        from hyperexport.library.passes.quantize_manifest import function_inputs, quantized_manifest
        from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass, names_a_module

        recipe = inputs.source
        rewrite_dir = inputs.dir("rewrite")
        manifest = ExportManifest.loads((rewrite_dir / MANIFEST_JSON).read_text(encoding="utf-8"))
        model = load_model(rewrite_dir / MODEL_FILE)
        for i, name in enumerate(q.exclude):
            if not names_a_module(model, name):
                raise RecipeError(
                    recipe, f"quantize.exclude[{i}]", f"{name!r} names no module or function"
                )
        before = function_inputs(model)
        exclude = tuple(q.exclude)
        quantize = QuantizeMatMulsPass(
            q.method, q.block_size, exclude, q.accuracy_level, q.symmetric, q.shared_embedding
        )
        if not quantize(model).modified:
            raise RecipeError(
                recipe,
                "quantize.method",
                f"{q.method}: the model has no MatMul with a constant weight to quantize "
                "(outside quantize.exclude)",
            )
        _refuse_unsupported(model, q.method, q.accuracy_level, recipe)
        quantized = quantized_manifest(manifest, before, model)
        save_compact(
            model,
            out_dir / QUANTIZED_MODEL_FILE,
            external_data=recipe_config.external_data,
            threshold=recipe_config.external_data_threshold,
        )
        text = quantized.dumps() + "\n"
        atomic_write_bytes(out_dir / QUANTIZED_MANIFEST_JSON, text.encode("utf-8"))
        if task_named(recipe_config.task).quantized_files:  # text-generation
            from hyperexport.library.tasks.genai_config import write_quantized_genai_config

            write_quantized_genai_config(inputs.dir("trace"), out_dir)


def _refuse_unsupported(model: Any, method: str, accuracy_level: int, recipe: str) -> None:
    """RecipeError naming ``quantize.method`` when ORT's CPU provider cannot run its op here."""
    from hyperexport.library.check.quantized_support import unsupported_reason
    from hyperexport.library.passes.quantize_matmul import MS_DOMAIN, QUANTIZED_OPS

    dtypes = set()
    for graph in (model.graph, *(f.graph for f in model.functions.values())):
        for node in graph:
            if node.domain == MS_DOMAIN and node.op_type == QUANTIZED_OPS[method]:
                scales = node.inputs[2]
                if scales is not None and scales.dtype is not None:
                    dtypes.add(scales.dtype.numpy().name)
    for dtype in sorted(dtypes):
        reason = unsupported_reason(method, dtype, accuracy_level)
        if reason is not None:
            raise RecipeError(
                recipe,
                "quantize.method",
                f"ONNX Runtime's CPU provider cannot run {QUANTIZED_OPS[method]} on {dtype} "
                f"weights: {reason.splitlines()[0]}",
            )

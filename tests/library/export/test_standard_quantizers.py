"""Standard tools read our float models: with ``rewrite.weights_as_initializers``, inlining the
functions (``onnx.inliner``) and ONNX Runtime's own ``MatMulNBitsQuantizer`` quantize as many
MatMuls as on a plain flat export of the same model; without it, none."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import onnx
import onnx.inliner
import pytest
import torch
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    MatMulNBitsQuantizer,
)

from hyperexport.library.models.inputs import make_inputs
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import compose_recipe
from hyperexport.product.stages import PIPELINE, model_loader


def _int4_count(model: onnx.ModelProto) -> int:
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(model, algo_config=DefaultWeightOnlyQuantConfig(block_size=32))
    quantizer.process()
    return Counter(n.op_type for n in quantizer.model.model.graph.node)["MatMulNBits"]


def _ours(tmp_path: Path, *overrides: str) -> onnx.ModelProto:
    recipe, settings = compose_recipe(
        [
            "recipe=llama",
            *overrides,
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={tmp_path / 'out'}",
        ]
    )
    outcome = run_build(recipe, settings, stages=PIPELINE, load_model=model_loader(recipe))
    assert outcome.exit_code == 0 and outcome.model_path is not None, outcome.result.error
    return onnx.inliner.inline_local_functions(onnx.load(outcome.model_path))


@pytest.mark.slow
def test_ort_quantizer_reaches_as_many_matmuls_as_on_a_plain_export(tmp_path: Path) -> None:
    recipe, _ = compose_recipe(["recipe=llama"])
    model = model_loader(recipe)()
    inputs = make_inputs(recipe.data["inputs"])
    plain_path = tmp_path / "plain.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (), str(plain_path), kwargs=inputs, dynamo=True)
    plain = _int4_count(onnx.load(plain_path))
    assert plain > 0

    lifted = _ours(tmp_path, "rewrite.weights_as_initializers=true")
    assert _int4_count(lifted) == plain
    per_type = _ours(tmp_path, "functions=per_type", "rewrite.weights_as_initializers=true")
    assert _int4_count(per_type) == plain
    assert _int4_count(_ours(tmp_path)) == 0  # baked Constants behind Transposes: none found

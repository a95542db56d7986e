"""``passes/quantize_manifest.py``: a quantized model's call sites name the main-graph
initializers that feed each quantized weight input, those the quantize stage packed first
included (``PackMatMulsPass.packed``)."""

from __future__ import annotations

import pytest

from hyperexport.base.contracts.manifest import CallSite, ExportManifest, FunctionEntry
from hyperexport.base.errors import RewriteError
from hyperexport.library.passes.pack_matmuls import PackMatMulsPass
from hyperexport.library.passes.quantize_manifest import function_inputs, quantized_manifest
from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass
from tests.library.passes.test_pack_matmuls import _layers_model


def _manifest() -> ExportManifest:
    calls = tuple(
        CallSite(
            f"c{i}",
            f"l{i}",
            "hyperexport.fn",
            "Layer",
            ("x",),
            tuple(f"l{i}.{p}.weight" for p in "qkv"),
            (f"q{i}", f"k{i}", f"v{i}"),
        )
        for i in range(2)
    )
    entry = FunctionEntry("hyperexport.fn", "Layer", "Layer", ("l0", "l1"))
    return ExportManifest(False, 18, "per_type", ("x",), ("o",), (entry,), calls)


def test_each_call_names_its_own_layer_s_packed_and_quantized_weights() -> None:
    model = _layers_model()
    before = function_inputs(model)
    pack = PackMatMulsPass()
    pack(model)
    assert QuantizeMatMulsPass("int8_dynamic")(model).modified
    quantized = quantized_manifest(_manifest(), before, model, pack.packed)
    for i, site in enumerate(quantized.calls):
        assert site.weight_inputs  # every one a main-graph initializer of this call's layer
        assert all(name.startswith(f"l{i}.q+k+v.weight.q8") for name in site.weight_inputs)
        assert all(name in model.graph.initializers for name in site.weight_inputs)


def test_a_packed_weight_the_manifest_is_not_told_of_is_refused() -> None:
    model = _layers_model()
    before = function_inputs(model)
    PackMatMulsPass()(model)
    QuantizeMatMulsPass("int8_dynamic")(model)
    with pytest.raises(RewriteError, match="is fed by no main-graph initializer"):
        quantized_manifest(_manifest(), before, model)

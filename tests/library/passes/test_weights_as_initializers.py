"""WeightsAsInitializersPass: MatMul weights become main-graph initializers in MatMul's layout,
fed to the functions as inputs; after inlining, MatMuls read initializers directly."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
import pytest

from hyperexport.library.passes.weights_as_initializers import WeightsAsInitializersPass
from tests.helpers.matmul_models import (
    FN,
    PER_INSTANCE,
    PER_TYPE,
    K,
    N,
    add_weights,
    bake,
    op_counts,
    run_checked,
    x_feed,
)
from tests.helpers.passes import parse


def _per_instance() -> ir.Model:
    model = parse(PER_INSTANCE)
    add_weights(model, ["lm_head.weight"])
    bake(model)
    return model


def _per_type() -> ir.Model:
    model = parse(PER_TYPE)
    add_weights(model, ["w0", "w1", "w2"])
    return model


def _matmul_weights_after_inlining(model: ir.Model) -> list[bool]:
    """For each MatMul of the inlined model: is its B a main-graph initializer?"""
    flat = onnx.inliner.inline_local_functions(ir.to_proto(model))
    initializers = {t.name for t in flat.graph.initializer}
    return [n.input[1] in initializers for n in flat.graph.node if n.op_type == "MatMul"]


@pytest.mark.parametrize("make", [_per_instance, _per_type], ids=["per_instance", "per_type"])
def test_weights_become_initializers_and_outputs_stay_equal(make: object) -> None:
    model = make()  # type: ignore[operator]
    before = run_checked(model, x_feed())[0]
    idents = set(model.functions)
    assert _matmul_weights_after_inlining(model).count(True) == 0

    assert WeightsAsInitializersPass()(model).modified

    assert set(model.functions) == idents  # functions stay functions
    counts = op_counts(model)
    assert sum(c["Transpose"] for c in counts.values()) == 0
    assert sum(c["Constant"] for c in counts.values()) == 0  # per_instance weights lifted
    np.testing.assert_array_equal(run_checked(model, x_feed())[0], before)
    flags = _matmul_weights_after_inlining(model)
    assert flags and all(flags)
    assert not WeightsAsInitializersPass()(model).modified


def test_per_instance_initializers_are_named_by_module_path() -> None:
    model = _per_instance()
    WeightsAsInitializersPass()(model)
    names = set(model.graph.initializers)
    assert {"Layers.0.proj.weight.kn", "Layers.1.proj.weight.kn", "lm_head.weight.kn"} <= names
    assert model.graph.initializers["Layers.0.proj.weight.kn"].shape == ir.Shape([K, K])
    assert model.graph.initializers["lm_head.weight.kn"].shape == ir.Shape([K, N])


def test_per_type_keeps_one_function_with_its_calls() -> None:
    model = _per_type()
    WeightsAsInitializersPass()(model)
    assert op_counts(model)["main"]["Outer"] == 3
    inner = model.functions[(FN, "Inner", "")]
    assert [v.name for v in inner.inputs] == ["u", "weight.kn"]


def test_exclude_keeps_a_weight_where_it_was() -> None:
    model = _per_instance()
    WeightsAsInitializersPass(exclude=("lm_head",))(model)
    assert op_counts(model)["main"]["Transpose"] == 1
    assert "lm_head.weight" in model.graph.initializers

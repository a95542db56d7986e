"""FuseConstantsIntoFunctionsPass on small ONNX-text models."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.library.passes.fuse_constants import FuseConstantsIntoFunctionsPass
from tests.helpers.passes import apply_preserving, parse

HEADER = '<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>'
SCALE = """
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Scale (a, s) => (out) {
    out = Mul (a, s)
}
"""

ONE_SITE = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    y = hyperexport.fn.Scale (x, w)
}
"""
    + SCALE
)

# Same value at both sites: once an initializer, once a Constant node.
SAME_VALUE = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    h = hyperexport.fn.Scale (x, w)
    c = Constant <value: tensor = float[2] {1.0, 2.0}> ()
    y = hyperexport.fn.Scale (h, c)
}
"""
    + SCALE
)

# Per-type: one function, each call fed its own weights. Nothing may be fused.
PER_TYPE = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w0 = {1.0, 2.0}, float[2] w1 = {3.0, 4.0}> {
    h = hyperexport.fn.Scale (x, w0)
    y = hyperexport.fn.Scale (h, w1)
}
"""
    + SCALE
)

# Not constants: a graph input, and an initializer that is also a graph input (a default).
NOT_CONSTANT = (
    HEADER
    + """
agraph (float[2] x, float[2] s, float[2] d) => (float[2] y) <float[2] d = {5.0, 6.0}> {
    h = hyperexport.fn.Scale (x, s)
    y = hyperexport.fn.Scale2 (h, d)
}
"""
    + SCALE
    + """
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Scale2 (a, s) => (out) {
    out = Add (a, s)
}
"""
)

# Outer gets the constant from the main graph and hands it to Inner: fused at both levels.
NESTED = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w = {2.0, 3.0}> {
    y = hyperexport.fn.Outer (x, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Inner (a, s) => (out) {
    out = Mul (a, s)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.fn" : 1]>
Outer (a, s) => (out) {
    h = hyperexport.fn.Inner (a, s)
    out = Add (h, s)
}
"""
)

# Outer hands its (constant) weights to Inner, called twice with different weights (per-type):
# fusing into Outer alone would cut Inner's weight off from the main graph, so nothing moves.
NESTED_PER_TYPE = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) <float[2] w0 = {2.0, 3.0}, float[2] w1 = {4.0, 5.0}> {
    y = hyperexport.fn.Outer (x, w0, w1)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Inner (a, s) => (out) {
    out = Mul (a, s)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.fn" : 1]>
Outer (a, s0, s1) => (out) {
    h = hyperexport.fn.Inner (a, s0)
    out = hyperexport.fn.Inner (h, s1)
}
"""
)

# A Constant node (value_float) inside a function feeds a nested call.
CONSTANT_IN_FUNCTION = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y) {
    y = hyperexport.fn.Outer (x)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Inner (a, k) => (out) {
    out = Add (a, k)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.fn" : 1]>
Outer (a) => (out) {
    k = Constant <value_float: float = 1.5> ()
    out = hyperexport.fn.Inner (a, k)
}
"""
)

# A function with no default-domain import: the Constant made in it needs one.
NO_DEFAULT_DOMAIN = (
    HEADER
    + """
agraph (float[2] x) => (float[2] y, float[2] z) <float[2] w = {7.0, 8.0}> {
    y, z = hyperexport.fn.Pass (x, w)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Id (v) => (out) {
    out = Identity (v)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Negate (v) => (out) {
    out = Neg (v)
}
<domain: "hyperexport.fn", opset_import: ["hyperexport.fn" : 1]>
Pass (a, s) => (a_out, s_out) {
    a_out = hyperexport.fn.Id (a)
    s_out = hyperexport.fn.Negate (s)
}
"""
)

FEEDS = {"x": np.array([1.0, -2.0], dtype=np.float32)}


def _fuse(text: str, feeds: dict[str, np.ndarray] = FEEDS) -> tuple[ir.Model, bool]:
    """Run the pass, check the model and ORT parity, and that a second run is a no-op."""
    return apply_preserving(FuseConstantsIntoFunctionsPass, text, feeds)


def _function(model: ir.Model, name: str) -> ir.Function:
    return model.functions[("hyperexport.fn", name, "")]


def _input_names(values: object) -> list[str | None]:
    return [v.name if v is not None else None for v in values]  # type: ignore[attr-defined]


def _op_types(function: ir.Function) -> list[str]:
    return [node.op_type for node in function]


def test_single_call_site_fuses_and_drops_initializer():
    model, modified = _fuse(ONE_SITE)
    assert modified
    scale = _function(model, "Scale")
    assert _input_names(scale.inputs) == ["a"]
    assert _op_types(scale) == ["Constant", "Mul"]
    constant = scale[0]
    assert constant.outputs[0].name == "s"
    np.testing.assert_array_equal(constant.attributes["value"].as_tensor().numpy(), [1.0, 2.0])
    assert _input_names(model.graph[0].inputs) == ["x"]
    assert "w" not in model.graph.initializers


def test_same_value_at_every_site_fuses_initializer_and_constant_node():
    model, modified = _fuse(SAME_VALUE)
    assert modified
    assert _input_names(_function(model, "Scale").inputs) == ["a"]
    assert [node.op_type for node in model.graph] == ["Scale", "Scale"]
    assert not model.graph.initializers


def test_per_type_weights_that_differ_are_not_fused():
    model, modified = _fuse(PER_TYPE)
    assert not modified
    assert _input_names(_function(model, "Scale").inputs) == ["a", "s"]
    assert [_input_names(node.inputs) for node in model.graph] == [["x", "w0"], ["h", "w1"]]
    assert set(model.graph.initializers) == {"w0", "w1"}


def test_graph_inputs_and_overridable_initializers_are_not_fused():
    feeds = {**FEEDS, "s": np.array([3.0, 4.0], np.float32), "d": np.array([1, 1], np.float32)}
    model, modified = _fuse(NOT_CONSTANT, feeds)
    assert not modified
    assert _input_names(_function(model, "Scale").inputs) == ["a", "s"]
    assert _input_names(_function(model, "Scale2").inputs) == ["a", "s"]


def test_nested_functions_fuse_to_fixpoint():
    model, modified = _fuse(NESTED)
    assert modified
    outer, inner = _function(model, "Outer"), _function(model, "Inner")
    assert _input_names(outer.inputs) == ["a"]
    assert _input_names(inner.inputs) == ["a"]
    assert _op_types(inner) == ["Constant", "Mul"]
    # Outer keeps its Constant for its own Add; the nested call no longer passes it.
    assert _op_types(outer) == ["Constant", "Inner", "Add"]
    assert _input_names(outer[1].inputs) == ["a"]
    assert not model.graph.initializers


def test_constant_handed_on_to_a_per_type_function_stays_an_input():
    model, modified = _fuse(NESTED_PER_TYPE)
    assert not modified
    assert _input_names(_function(model, "Outer").inputs) == ["a", "s0", "s1"]
    assert _input_names(_function(model, "Inner").inputs) == ["a", "s"]
    assert set(model.graph.initializers) == {"w0", "w1"}


def test_constant_node_inside_a_function_moves_into_the_callee():
    model, modified = _fuse(CONSTANT_IN_FUNCTION)
    assert modified
    outer, inner = _function(model, "Outer"), _function(model, "Inner")
    assert _op_types(outer) == ["Inner"]  # its Constant had no other use and is gone
    assert _input_names(inner.inputs) == ["a"]
    assert _op_types(inner) == ["Constant", "Add"]
    tensor = inner[0].attributes["value"].as_tensor()
    assert tensor.dtype == ir.DataType.FLOAT
    assert tensor.numpy().shape == ()


def test_function_without_default_domain_gets_the_import():
    model, modified = _fuse(NO_DEFAULT_DOMAIN)
    assert modified
    passer, negate = _function(model, "Pass"), _function(model, "Negate")
    assert _input_names(passer.inputs) == ["a"]
    assert passer.opset_imports[""] == 18
    assert _op_types(passer) == ["Id", "Negate"]  # its Constant went on into Negate
    assert _input_names(negate.inputs) == []
    assert _op_types(negate) == ["Constant", "Neg"]
    assert _input_names(_function(model, "Id").inputs) == ["v"]


def test_call_with_too_many_inputs_fails_precondition():
    text = (
        HEADER
        + """
agraph (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    y = hyperexport.fn.Scale (x, w, w)
}
"""
        + SCALE
    )
    with pytest.raises(ir.passes.PreconditionError, match="passes 3 inputs"):
        FuseConstantsIntoFunctionsPass()(parse(text))


def test_model_without_functions_is_untouched():
    model = parse(HEADER + "\nagraph (float[2] x) => (float[2] y) { y = Relu (x) }\n")
    assert not FuseConstantsIntoFunctionsPass()(model).modified


def test_call_site_in_a_subgraph_counts():
    text = (
        HEADER
        + """
agraph (float[2] x, bool c) => (float[2] y) <float[2] w = {1.0, 2.0}> {
    y = If (c) <
        then_branch = then_g () => (float[2] t) { t = hyperexport.fn.Scale (x, w) },
        else_branch = else_g () => (float[2] e) { e = hyperexport.fn.Scale (x, w) }
    >
}
"""
        + SCALE
    )
    for flag in (True, False):
        model, modified = _fuse(text, {**FEEDS, "c": np.array(flag)})
        assert modified
        assert _input_names(_function(model, "Scale").inputs) == ["a"]
        assert not model.graph.initializers


def test_same_bytes_but_different_dtype_is_not_the_same_constant():
    text = (
        HEADER
        + """
agraph (int32[1] x) => (int32[1] y) {
    a = Constant <value: tensor = int32[1] {0}> ()
    b = Constant <value: tensor = float[1] {0.0}> ()
    ai = hyperexport.fn.Pick (x, a)
    y = hyperexport.fn.Pick (ai, b)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Pick (v, k) => (out) {
    out = Identity (v)
}
"""
    )
    model, modified = _fuse(text, {"x": np.array([3], np.int32)})
    assert not modified
    assert _input_names(_function(model, "Pick").inputs) == ["v", "k"]

"""PromoteAttentionToOpset24Pass on small ONNX-text models."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

from hyperexport.base.errors import RewriteError
from hyperexport.library.passes.promote_attention import PromoteAttentionToOpset24Pass
from hyperexport.library.transformers.attention_op import attention_reference
from tests.helpers.passes import run_checked

HEADER = '<ir_version: 8, opset_import: ["" : 18, "hyperexport.attention" : 1]>'

FOUR_D = (
    HEADER
    + """
agraph (float[2,4,5,8] q, float[2,2,7,8] k, float[2,2,7,8] v, bool[2,1,5,7] m) => (float[2,4,5,8] y) {
    a = hyperexport.attention.Attention <is_causal: int = 0, scale: float = 0.3> (q, k, v, m)
    y = Relu (a)
}
"""
)

THREE_D = (
    HEADER
    + """
agraph (float[2,5,32] q, float[2,5,16] k, float[2,5,16] v) => (float[2,5,32] y) {
    y = hyperexport.attention.Attention <is_causal: int = 1, scale: float = 0.25, q_num_heads: int = 4, kv_num_heads: int = 2> (q, k, v)
}
"""
)

IN_FUNCTION = """
<ir_version: 8, opset_import: ["" : 18, "hyperexport.fn" : 1]>
agraph (float[2,4,5,8] q, float[2,2,5,8] k, float[2,2,5,8] v) => (float[2,4,5,8] y) {
    h = hyperexport.fn.Layer (q, k, v)
    y = hyperexport.fn.Layer (h, k, v)
}
<domain: "hyperexport.fn", opset_import: ["" : 18, "hyperexport.attention" : 1]>
Layer (q, k, v) => (out) {
    a = hyperexport.attention.Attention <is_causal: int = 1, scale: float = 0.5> (q, k, v)
    out = Add (a, q)
}
"""


def _promote(text: str) -> tuple[ir.Model, ir.passes.PassResult]:
    model = ir.from_proto(onnx.parser.parse_model(text))
    return model, PromoteAttentionToOpset24Pass()(model)


def _attention_nodes(model: ir.Model) -> list[ir.Node]:
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    return [node for node in nodes if node.op_type == "Attention"]


def _attrs(node: ir.Node) -> dict[str, object]:
    return {name: attr.value for name, attr in node.attributes.items()}


def _run(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return run_checked(model, feeds)[0]


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_four_d_gqa_with_mask():
    model, result = _promote(FOUR_D)
    assert result.modified
    [node] = _attention_nodes(model)
    assert node.domain == ""
    assert _attrs(node) == pytest.approx({"scale": 0.3})
    assert model.opset_imports == {"": 24}
    assert model.ir_version >= 12

    q, k, v = _rand(2, 4, 5, 8, seed=1), _rand(2, 2, 7, 8, seed=2), _rand(2, 2, 7, 8, seed=3)
    mask = np.random.default_rng(4).random((2, 1, 5, 7)) > 0.3
    got = _run(model, {"q": q, "k": k, "v": v, "m": mask})
    tq, tk, tv, tm = map(torch.from_numpy, (q, k, v, mask))
    expected = torch.relu(attention_reference(tq, tk, tv, tm, scale=0.3)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_three_d_keeps_head_counts():
    model, result = _promote(THREE_D)
    assert result.modified
    [node] = _attention_nodes(model)
    assert _attrs(node) == pytest.approx(
        {"is_causal": 1, "scale": 0.25, "q_num_heads": 4, "kv_num_heads": 2}
    )
    q, k, v = _rand(2, 5, 32, seed=1), _rand(2, 5, 16, seed=2), _rand(2, 5, 16, seed=3)
    got = _run(model, {"q": q, "k": k, "v": v})
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    expected = attention_reference(
        tq, tk, tv, is_causal=True, scale=0.25, q_num_heads=4, kv_num_heads=2
    ).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_nodes_inside_functions_are_promoted_and_opsets_raised():
    model, result = _promote(IN_FUNCTION)
    assert result.modified
    [function] = model.functions.values()
    [node] = _attention_nodes(model)
    assert node in list(function)
    assert node.domain == ""
    assert _attrs(node) == pytest.approx({"is_causal": 1, "scale": 0.5})
    assert function.opset_imports == {"": 24}
    assert model.opset_imports == {"": 24, "hyperexport.fn": 1}

    q, k, v = _rand(2, 4, 5, 8, seed=1), _rand(2, 2, 5, 8, seed=2), _rand(2, 2, 5, 8, seed=3)
    got = _run(model, {"q": q, "k": k, "v": v})
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    h = attention_reference(tq, tk, tv, is_causal=True, scale=0.5) + tq
    expected = (attention_reference(h, tk, tv, is_causal=True, scale=0.5) + h).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_head_counts_are_trusted_where_shapes_are_unknown():
    # Inside a function without value shapes, head counts on the node mean 3-D inputs.
    text = IN_FUNCTION.replace(
        "scale: float = 0.5>", "scale: float = 0.5, q_num_heads: int = 4, kv_num_heads: int = 2>"
    )
    model, _ = _promote(text)
    [node] = _attention_nodes(model)
    assert _attrs(node)["q_num_heads"] == 4 and _attrs(node)["kv_num_heads"] == 2


@pytest.mark.parametrize("text", [FOUR_D, THREE_D, IN_FUNCTION])
def test_second_run_changes_nothing(text):
    model, _ = _promote(text)
    before = ir.to_proto(model).SerializeToString()
    assert not PromoteAttentionToOpset24Pass()(model).modified
    assert ir.to_proto(model).SerializeToString() == before


def test_model_without_attention_is_untouched():
    model = ir.from_proto(
        onnx.parser.parse_model(
            '<ir_version: 8, opset_import: ["" : 18]> g (float[2] x) => (float[2] y) { y = Relu (x) }'
        )
    )
    assert not PromoteAttentionToOpset24Pass()(model).modified
    assert model.opset_imports == {"": 18}


def test_softcap_is_promoted():
    text = FOUR_D.replace("scale: float = 0.3>", "scale: float = 0.3, softcap: float = 2.0>")
    model, _ = _promote(text)
    [node] = _attention_nodes(model)
    assert _attrs(node) == pytest.approx({"scale": 0.3, "softcap": 2.0})
    q, k, v = _rand(2, 4, 5, 8, seed=1), _rand(2, 2, 7, 8, seed=2), _rand(2, 2, 7, 8, seed=3)
    mask = np.ones((2, 1, 5, 7), dtype=bool)
    got = _run(model, {"q": q, "k": k, "v": v, "m": mask})
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    expected = torch.relu(attention_reference(tq, tk, tv, scale=0.3, softcap=2.0)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (", q_num_heads: int = 4, kv_num_heads: int = 2", "", "need q_num_heads"),
        ("kv_num_heads: int = 2", "kv_num_heads: int = 3", "not a multiple"),
        ("scale: float = 0.25", "scale: float = 0.25, window: int = 3", "no ONNX"),
        ("(q, k, v)", "(q, k, v, q, q)", "expected inputs"),
        ("float[2,5,16] k", "float[2,1,5,16] k", "different ranks"),
    ],
)
def test_refusals_name_the_problem_and_leave_the_model_alone(old, new, message):
    text = THREE_D.replace(old, new)
    model = ir.from_proto(onnx.parser.parse_model(text))
    before = ir.to_proto(model).SerializeToString()
    with pytest.raises(RewriteError, match=message):
        PromoteAttentionToOpset24Pass()(model)
    assert ir.to_proto(model).SerializeToString() == before


def test_integer_mask_is_refused():
    text = FOUR_D.replace("bool[2,1,5,7] m", "int64[2,1,5,7] m")
    with pytest.raises(RewriteError, match="attn_mask"):
        _promote(text)


def test_opset_raise_refuses_ops_that_changed_meaning():
    text = FOUR_D.replace(
        "y = Relu (a)", 'y = GridSample <mode: string = "bilinear"> (a, g)'
    ).replace("bool[2,1,5,7] m)", "bool[2,1,5,7] m, float[2,5,8,2] g)")
    with pytest.raises(RewriteError, match="GridSample changed meaning"):
        _promote(text)


def test_opset_raise_refuses_reduce_ops_with_axes_attribute_from_before_18():
    # A TorchScript export at opset 17 writes RMSNorm's ReduceMean with an ``axes`` attribute,
    # which opset 18 moved to an input: re-declaring 24 would leave an invalid node.
    text = FOUR_D.replace("y = Relu (a)", "y = ReduceMean <axes = [-1]> (a)")
    text = text.replace('"" : 18', '"" : 17').replace('"" : 20', '"" : 17')
    with pytest.raises(RewriteError, match="ReduceMean changed meaning at opset 18"):
        _promote(text)

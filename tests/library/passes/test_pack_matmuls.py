"""``passes/pack_matmuls.py``: MatMuls that read one activation become one MatMul over their
weights side by side and a ``Split``, through functions and their call sites.

Small models as ONNX text, their weights attached as initializers: a layer function called twice
(per_type: each call its own weights) whose three projections read one input, as torch's
``Linear`` exports them (``MatMul(x, Transpose(W))``); the same with the weights as ``Constant``
nodes (per_instance); and cases that must stay unpacked. ONNX Runtime runs each model before and
after: the outputs agree."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from hyperexport.library.passes.pack_matmuls import PackMatMulsPass, packed_name

LAYERS = """
<ir_version: 10, opset_import: ["" : 18, "hyperexport.fn" : 1]>
main (float[2, 3, 8] x) => (float[2, 3, 4] q1, float[2, 3, 2] k1, float[2, 3, 2] v1, float[2, 3, 6] o) {
    q0, k0, v0 = hyperexport.fn.Layer (x, l0_q, l0_k, l0_v)
    q1, k1, v1 = hyperexport.fn.Layer (x, l1_q, l1_k, l1_v)
    qk = Concat <axis = -1> (q0, k0)
    o = MatMul (x, proj)
}
<domain: "hyperexport.fn", opset_import: ["" : 18]>
Layer (x, wq, wk, wv) => (q, k, v) {
    tq = Transpose <perm = [1, 0]> (wq)
    q = MatMul (x, tq)
    tk = Transpose <perm = [1, 0]> (wk)
    k = MatMul (x, tk)
    tv = Transpose <perm = [1, 0]> (wv)
    v = MatMul (x, tv)
}
"""

SHAPES = {"q": (4, 8), "k": (2, 8), "v": (2, 8)}


def _layers_model(seed: int = 0) -> ir.Model:
    proto = onnx.parser.parse_model(LAYERS)
    for node in proto.graph.node:  # dotted module names, as exported weights have
        node.input[:] = [_dotted(name) for name in node.input]
    rng = np.random.default_rng(seed)
    for layer in ("l0", "l1"):
        for name, shape in SHAPES.items():
            array = rng.standard_normal(shape, dtype=np.float32)
            proto.graph.initializer.append(numpy_helper.from_array(array, f"{layer}.{name}.weight"))
    proto.graph.initializer.append(
        numpy_helper.from_array(rng.standard_normal((8, 6), dtype=np.float32), "proj")
    )
    return ir.serde.deserialize_model(proto)


def _dotted(name: str) -> str:
    layer, _, projection = name.partition("_")
    return f"{layer}.{projection}.weight" if projection in SHAPES else name


def _run(model: ir.Model, x: np.ndarray) -> list[np.ndarray]:
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _ops(graph: ir.Graph) -> list[str]:
    return [node.op_type for node in graph]


@pytest.fixture
def x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 3, 8), dtype=np.float32)


def test_a_function_s_projections_become_one_matmul_fed_at_every_call_site(x: np.ndarray) -> None:
    model = _layers_model()
    expected = _run(model, x)
    assert PackMatMulsPass()(model).modified
    [function] = model.functions.values()
    assert _ops(function.graph).count("MatMul") == 1
    assert _ops(function.graph).count("Split") == 1
    # one weight input in place of three, fed the packed weights of each call's own layer
    assert len(function.inputs) == 2
    packed = {v.name: v.const_value.numpy() for v in model.graph.initializers.values()}
    assert sorted(packed) == ["l0.q+k+v.weight", "l1.q+k+v.weight", "proj"]
    assert packed["l1.q+k+v.weight"].shape == (8, 8)
    # the main graph's own MatMul has no partner on its input: it stays as it was
    assert _ops(model.graph).count("MatMul") == 1
    for got, want in zip(_run(model, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not PackMatMulsPass()(model).modified


def test_constant_weights_pack_where_they_are(x: np.ndarray) -> None:
    """per_instance: the weights are ``Constant`` nodes in the function; packed as one."""
    text = LAYERS.replace("(x, l0_q, l0_k, l0_v)", "(x)").replace("(x, l1_q, l1_k, l1_v)", "(x)")
    rng = np.random.default_rng(0)
    constants = "\n".join(
        f"    w{name} = Constant <value = float[{shape[0]}, {shape[1]}] "
        f"{{{', '.join(str(float(v)) for v in rng.standard_normal(shape).ravel())}}}> ()"
        for name, shape in SHAPES.items()
    )
    text = text.replace(
        "Layer (x, wq, wk, wv) => (q, k, v) {", "Layer (x) => (q, k, v) {\n" + constants
    )
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(
        numpy_helper.from_array(rng.standard_normal((8, 6), dtype=np.float32), "proj")
    )
    model = ir.serde.deserialize_model(proto)
    expected = _run(model, x)
    assert PackMatMulsPass()(model).modified
    [function] = model.functions.values()
    assert _ops(function.graph).count("MatMul") == 1
    assert _ops(function.graph).count("Constant") == 2  # the packed weight and the split sizes
    for got, want in zip(_run(model, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_weights_from_different_places_or_of_different_k_stay_unpacked(x: np.ndarray) -> None:
    # the value weight is an initializer of the function's caller at one call site and the
    # function's own Constant at the other: the three cannot become one input
    model = _layers_model()
    [function] = model.functions.values()
    transpose_v = next(n for n in function if n.outputs[0].name == "tv")
    own = ir.Node(
        "", "Constant", [], [ir.AttrTensor("value", ir.tensor(np.ones((2, 8), np.float32)))]
    )
    function.graph.insert_before(transpose_v, own)
    transpose_v.replace_input_with(0, own.outputs[0])
    before = _ops(function.graph).count("MatMul")
    expected = _run(model, x)
    PackMatMulsPass()(model)
    # q and k still pack (both inputs), v stays alone
    assert _ops(function.graph).count("MatMul") == before - 1
    for got, want in zip(_run(model, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_activation_that_is_not_a_weight_is_left_alone(x: np.ndarray) -> None:
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    main (float[2, 3, 8] x, float[8, 4] a, float[8, 4] b) => (float[2, 3, 4] y, float[2, 3, 4] z) {
        y = MatMul (x, a)
        z = MatMul (x, b)
    }
    """
    model = ir.serde.deserialize_model(onnx.parser.parse_model(text))
    assert not PackMatMulsPass()(model).modified


@pytest.mark.parametrize(
    ("names", "packed"),
    [
        (
            ["a.q_proj.weight", "a.k_proj.weight", "a.v_proj.weight"],
            "a.q_proj+k_proj+v_proj.weight",
        ),
        (["wq", "wk"], "wq+wk"),
        (["m.gate.weight", "m.up.weight"], "m.gate+up.weight"),
    ],
)
def test_the_packed_weight_is_named_after_its_members(names: list[str], packed: str) -> None:
    assert packed_name(names) == packed

"""QuantizeMatMulsPass: MatMuls inside functions become ORT's quantized ops; functions stay."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hyperexport.passes.quantize_matmul import QUANTIZED_OPS, QuantizeMatMulsPass
from hyperexport.passes.quantize_weights import (
    INT4_BLOCK,
    INT8_DYNAMIC,
    dequantize_int4_blocks,
    dequantize_int8_columns,
    quantize_int4_blocks,
    quantize_int8_columns,
)
from tests.helpers.ort import session_for
from tests.helpers.passes import parse

K, N = 64, 48
FN = "hyperexport.fn"

# per_type: one shared body, weights as inputs; Outer passes its weight on to Inner (nesting).
PER_TYPE = f"""
<ir_version: 10, opset_import: ["" : 18, "{FN}" : 1]>
main (float[2,3,{K}] x, float[{N},{K}] w0, float[{N},{K}] w1, float[{N},{K}] w2) => (float[2,3,{N}] y) {{
  a = {FN}.Outer (x, w0)
  b = {FN}.Outer (x, w1)
  c = {FN}.Outer (x, w2)
  ab = Add (a, b)
  y = Add (ab, c)
}}
<domain: "{FN}", opset_import: ["" : 18, "{FN}" : 1]>
Outer (h, w) => (out) {{
  r = Relu (h)
  out = {FN}.Inner (r, w)
}}
<domain: "{FN}", opset_import: ["" : 18]>
Inner (u, weight) => (v) {{
  t = Transpose <perm = [1, 0]> (weight)
  v = MatMul (u, t)
}}
"""

# per_instance: each function holds its weight as a Constant; the main graph has an lm_head.
PER_INSTANCE = f"""
<ir_version: 10, opset_import: ["" : 18, "{FN}" : 1]>
main (float[2,3,{K}] x, float[{N},{K}] lm_head_weight) => (float[2,3,{N}] y) {{
  a = {FN}.Layer_0 (x)
  b = {FN}.Layer_1 (a)
  t = Transpose <perm = [1, 0]> (lm_head_weight)
  y = MatMul (b, t)
}}
<domain: "{FN}", opset_import: ["" : 18]>
Layer_0 (h) => (out) {{
  proj_weight = Constant <value = float[{K},{K}] proj_weight {{0.0}}> ()
  t = Transpose <perm = [1, 0]> (proj_weight)
  out = MatMul (h, t)
}}
<domain: "{FN}", opset_import: ["" : 18]>
Layer_1 (h) => (out) {{
  proj_weight = Constant <value = float[{K},{K}] proj_weight {{0.0}}> ()
  out = MatMul (h, proj_weight)
}}
"""


def run_checked(model: ir.Model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Check the model (onnx's shape inference knows no com.microsoft op: no full check), run it."""
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto)
    return session_for(proto).run(None, feeds)


def _weights(model: ir.Model, names: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Turn main-graph inputs ``names`` into random initializers; return their arrays."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name in names:
        value = next(v for v in model.graph.inputs if v.name == name.replace(".", "_"))
        value.name = name
        shape = tuple(d if isinstance(d, int) else 1 for d in value.shape or ())
        arrays[name] = rng.standard_normal(shape).astype(np.float32)
        model.graph.inputs.remove(value)
        value.const_value = ir.Tensor(arrays[name], name=name)
        model.graph.register_initializer(value)
    return arrays


def _bake(model: ir.Model, seed: int = 1) -> dict[str, np.ndarray]:
    """Random values for the per_instance functions' Constant weights (by function name)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for function in model.functions.values():
        function.metadata_props["hyperexport.module_path"] = function.name.replace("_", "s.")
        for node in function:
            if node.op_type == "Constant":
                arrays[function.name] = rng.standard_normal((K, K)).astype(np.float32)
                node.attributes["value"] = ir.AttrTensor("value", ir.Tensor(arrays[function.name]))
                node.outputs[0].name = "proj.weight"
    return arrays


def _x() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(7).standard_normal((2, 3, K)).astype(np.float32)}


def _ops(model: ir.Model) -> dict[str, Counter[str]]:
    counts = {f.name: Counter(n.op_type for n in f) for f in model.functions.values()}
    counts["main"] = Counter(n.op_type for n in model.graph)
    return counts


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _dequantized(method: str, w_nk: np.ndarray) -> np.ndarray:
    """The [N, K] weight the quantized op stands for (computed independently of the pass)."""
    if method == INT4_BLOCK:
        return dequantize_int4_blocks(quantize_int4_blocks(w_nk, 32))
    return dequantize_int8_columns(quantize_int8_columns(w_nk.T)).T


#: Expected relative error against float on standard-normal weights and inputs: 4-bit codes
#: over a block's range give ~8%; 8-bit per column, weights and activations, ~1%.
FLOAT_BOUND = {INT4_BLOCK: 0.12, INT8_DYNAMIC: 0.03}


@pytest.mark.parametrize("method", [INT4_BLOCK, INT8_DYNAMIC])
def test_per_type_quantizes_inside_the_shared_body(method: str) -> None:
    model = parse(PER_TYPE)
    weights = _weights(model, ["w0", "w1", "w2"])
    before = run_checked(model, _x())[0]
    idents = set(model.functions)

    assert QuantizeMatMulsPass(method, block_size=32)(model).modified

    ops = _ops(model)
    op = QUANTIZED_OPS[method]
    assert set(model.functions) == idents  # functions stay functions, same ids
    assert ops["Inner"][op] == 1 and ops["Inner"]["MatMul"] == 0 and ops["Inner"]["Transpose"] == 0
    assert ops["main"]["Outer"] == 3  # still one function, three calls
    inner = model.functions[(FN, "Inner", "")]
    assert [v.name for v in inner.inputs][:1] == ["u"] and len(
        inner.inputs
    ) == 4  # u, q, scales, zp
    assert not {"w0", "w1", "w2"} & set(model.graph.initializers)  # float weights are gone
    after = run_checked(model, _x())[0]
    x = np.maximum(_x()["x"], 0)
    expected = sum(x @ _dequantized(method, w).T for w in weights.values())
    assert _rel(after, expected) < (1e-5 if method == INT4_BLOCK else 0.01)
    assert _rel(after, before) < FLOAT_BOUND[method]
    assert not QuantizeMatMulsPass(method, block_size=32)(model).modified


@pytest.mark.parametrize("method", [INT4_BLOCK, INT8_DYNAMIC])
def test_per_instance_quantizes_baked_weights_and_main_graph(method: str) -> None:
    model = parse(PER_INSTANCE)
    head = _weights(model, ["lm_head.weight"])["lm_head.weight"]
    baked = _bake(model)
    before = run_checked(model, _x())[0]

    assert QuantizeMatMulsPass(method, block_size=32)(model).modified

    ops = _ops(model)
    op = QUANTIZED_OPS[method]
    assert ops["Layer_0"][op] == ops["Layer_1"][op] == ops["main"][op] == 1
    assert sum(c["MatMul"] for c in ops.values()) == 0
    assert len(model.functions) == 2 and ops["main"]["Layer_0"] == ops["main"]["Layer_1"] == 1
    after = run_checked(model, _x())[0]
    h = _x()["x"] @ _dequantized(method, baked["Layer_0"]).T  # Transpose of an [N, K] weight
    h = h @ _dequantized(method, baked["Layer_1"].T).T  # a [K, N] weight as it is
    expected = h @ _dequantized(method, head).T
    assert _rel(after, expected) < (1e-5 if method == INT4_BLOCK else 0.02)
    assert _rel(after, before) < 2 * FLOAT_BOUND[method]
    assert not QuantizeMatMulsPass(method, block_size=32)(model).modified


def test_exclude_by_module_path_and_function_name() -> None:
    model = parse(PER_INSTANCE)
    _weights(model, ["lm_head.weight"])
    _bake(model)
    before = run_checked(model, _x())[0]

    assert QuantizeMatMulsPass(INT4_BLOCK, exclude=("lm_head", "Layer_1"))(model).modified
    ops = _ops(model)
    assert ops["Layer_0"]["MatMulNBits"] == 1
    assert ops["Layer_1"]["MatMul"] == 1 and ops["main"]["MatMul"] == 1
    assert "lm_head.weight" in model.graph.initializers
    assert _rel(run_checked(model, _x())[0], before) < FLOAT_BOUND[INT4_BLOCK]


def test_exclude_by_module_path_of_a_baked_weight() -> None:
    model = parse(PER_INSTANCE)
    _weights(model, ["lm_head.weight"])
    _bake(model)  # Layer_0's module path is "Layers.0"
    QuantizeMatMulsPass(INT4_BLOCK, exclude=("Layers.0",))(model)
    ops = _ops(model)
    assert ops["Layer_0"]["MatMul"] == 1 and ops["Layer_1"]["MatMulNBits"] == 1


def test_per_type_call_site_excluded_keeps_the_shared_body_float() -> None:
    model = parse(PER_TYPE)
    _weights(model, ["w0", "w1", "w2"])
    assert not QuantizeMatMulsPass(INT4_BLOCK, exclude=("w1",))(model).modified
    assert _ops(model)["Inner"]["MatMul"] == 1


def test_weight_that_is_data_at_one_call_site_stays_float() -> None:
    model = parse(PER_TYPE)
    _weights(model, ["w0", "w2"])  # w1 stays a graph input: not a constant
    assert not QuantizeMatMulsPass(INT4_BLOCK)(model).modified
    assert _ops(model)["Inner"]["MatMul"] == 1


def test_block_size_must_be_a_power_of_two_from_16() -> None:
    for bad in (8, 24, 100):
        with pytest.raises(ValueError, match="power of two"):
            QuantizeMatMulsPass(INT4_BLOCK, block_size=bad)
    with pytest.raises(ValueError, match="int4_block"):
        QuantizeMatMulsPass("int3")


def test_block_size_that_does_not_divide_k_pads() -> None:
    w = np.random.default_rng(3).standard_normal((5, 40)).astype(np.float32)
    q = quantize_int4_blocks(w, 32)
    assert q.packed.shape == (5, 2, 16) and q.scales.shape == (10,) and q.zero_points.shape == (5,)
    assert _rel(dequantize_int4_blocks(q), w) < 0.12

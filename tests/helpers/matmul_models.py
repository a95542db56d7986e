"""Small models whose MatMuls read constant weights, in both function modes, for the tests of
the passes that rewrite MatMul weights (``library/passes/matmul_weights.py`` and its subclasses)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir

from tests.helpers.ort import session_for

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


def add_weights(model: ir.Model, names: list[str], seed: int = 0) -> dict[str, np.ndarray]:
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


def bake(model: ir.Model, seed: int = 1) -> dict[str, np.ndarray]:
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


def x_feed() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(7).standard_normal((2, 3, K)).astype(np.float32)}


def op_counts(model: ir.Model) -> dict[str, Counter[str]]:
    counts = {f.name: Counter(n.op_type for n in f) for f in model.functions.values()}
    counts["main"] = Counter(n.op_type for n in model.graph)
    return counts

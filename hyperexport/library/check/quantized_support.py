"""Whether ONNX Runtime's CPU provider runs a quantized op at a dtype: asked, not assumed.

A one-node model with the op (small weights quantized by ``passes/quantize_weights.py``) is
loaded and run; what ONNX Runtime says when it refuses is the reason given to the user.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from hyperexport.base.errors import CheckError
from hyperexport.library.check.ort_session import ORT_ERRORS, OrtRunner
from hyperexport.library.passes.quantize_matmul import MS_DOMAIN, QUANTIZED_OPS
from hyperexport.library.passes.quantize_weights import (
    INT4_BLOCK,
    quantize_int4_blocks,
    quantize_int8_columns,
)

_K = _N = 16


def _probe_model(method: str, dtype: np.dtype, accuracy_level: int = 0) -> ir.Model:
    weight = np.linspace(-1, 1, _K * _N, dtype=np.float32).reshape(_N, _K).astype(dtype)
    attributes: dict[str, int] = {}
    if method == INT4_BLOCK:
        q = quantize_int4_blocks(weight, 16)
        arrays = q.arrays()
        attributes = {"K": _K, "N": _N, "bits": 4, "block_size": 16}
        if accuracy_level:
            attributes["accuracy_level"] = accuracy_level
    else:
        c = quantize_int8_columns(weight.T.copy())
        arrays = [c.weight, c.scales, c.zero_points]
    element = ir.DataType.from_numpy(np.dtype(dtype))
    x = ir.Value(name="x", type=ir.TensorType(element), shape=ir.Shape([1, _K]))
    weights = []
    for i, array in enumerate(arrays):
        value = ir.Value(name=f"w{i}", const_value=ir.Tensor(array, name=f"w{i}"))
        value.type, value.shape = ir.TensorType(value.const_value.dtype), ir.Shape(array.shape)  # type: ignore[union-attr]
        weights.append(value)
    node = ir.node(QUANTIZED_OPS[method], [x, *weights], attributes=attributes, domain=MS_DOMAIN)
    node.outputs[0].name = "y"
    graph = ir.Graph(
        [x],
        node.outputs,
        nodes=[node],
        initializers=weights,
        opset_imports={"": 18, MS_DOMAIN: 1},
        name="probe",
    )
    return ir.Model(graph, ir_version=10)


@functools.cache
def unsupported_reason(method: str, dtype_name: str, accuracy_level: int = 0) -> str | None:
    """Why ONNX Runtime's CPU provider cannot run ``method``'s op on ``dtype_name`` (int4 at
    ``accuracy_level``), or None."""
    dtype = np.dtype(dtype_name)
    proto = ir.to_proto(_probe_model(method, dtype, accuracy_level)).SerializeToString()
    try:
        runner = OrtRunner(proto)
        runner.run({"x": np.ones((1, _K), dtype=dtype)}, [(1, _N)])
    except CheckError as e:
        return str(e)
    except ORT_ERRORS as e:
        return f"ONNX Runtime cannot run it: {e}"
    return None

"""Give MatMuls their weights as main-graph initializers, as a flat export does.

Standard tools read weights as initializers: ONNX Runtime's ``MatMulNBitsQuantizer`` and
``quantize_dynamic`` quantize a MatMul only when its ``B`` *is* an initializer. A hierarchical
model hides them: per_instance functions bake each weight in as a ``Constant`` node, and torch's
``Linear`` reads its weight through a ``Transpose`` in both modes. This pass (recipe
``rewrite.weights_as_initializers``) makes every MatMul weight a main-graph initializer laid out
as MatMul reads it (``[K, N]``, transposed once here), passed to the functions as inputs
(``passes/matmul_weights.py`` threads them through nested calls). Functions stay functions;
after ``onnx.inliner.inline_local_functions`` the model is one graph whose MatMuls read
initializers directly.

Cost: a transposed weight is a new tensor, appended to the data file; the export's original
bytes stay in the cloned data file unread.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hyperexport.library.passes.matmul_weights import Candidate, MatMulWeightsPass


class WeightsAsInitializersPass(MatMulWeightsPass):
    """Every constant MatMul weight becomes a main-graph initializer in MatMul's ``[K, N]``."""

    lift_constants = True
    label = "weights_as_initializers"

    def _wanted(self, candidate: Candidate) -> bool:
        # Already in form: not through a Transpose, and from initializers at every call site.
        return candidate.transposed or any(leaf.constant for leaf in candidate.leaves)

    def _tensors(self, tensor: ir.TensorProtocol, transposed: bool) -> list[np.ndarray]:
        weight = tensor.numpy()
        return [np.ascontiguousarray(weight.T) if transposed else weight]

    def _names(self, base: str) -> list[str]:
        return [f"{base}.kn"]  # laid out [K, N], as MatMul reads it

    def _replace(self, model: ir.Model, candidate: Candidate, operands: list[ir.Value]) -> None:
        node = candidate.node
        node.replace_input_with(1, operands[0])

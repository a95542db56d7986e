"""onnxscript's optimizer (constant folding, dead code removal) with functions kept."""

from __future__ import annotations

import onnx_ir as ir


class OptimizeKeepFunctionsPass(ir.passes.InPlacePass):
    """Run ``onnxscript.optimizer.optimize(inline=False)``: folding happens inside functions too,
    but no function is inlined, so the hierarchy survives."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import onnxscript.optimizer

        onnxscript.optimizer.optimize(model, inline=False)
        return ir.passes.PassResult(model, modified=True)

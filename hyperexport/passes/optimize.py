"""onnxscript's optimizer (constant folding, dead code removal) with functions kept."""

from __future__ import annotations

import logging

import onnx_ir as ir

log = logging.getLogger(__name__)


def _materialize_orphan_constants(model: ir.Model) -> int:
    """Give every folded constant that the optimizer left without a home an initializer.

    Observed with onnxscript 0.7.2 on the composed Llama graph: a folded Reshape shape comes
    back as a value that has a ``const_value`` but neither a producer nor an entry in the
    graph's initializers, which the ONNX checker rejects as unsorted.
    """
    count = 0
    graphs = [model.graph, *(f.graph for f in model.functions.values())]
    for graph in graphs:
        for node in list(graph):
            for index, value in enumerate(node.inputs):
                if value is None or value.producer() is not None or value.const_value is None:
                    continue
                if value.is_graph_input() or value.is_initializer():
                    continue
                if graph is model.graph:
                    graph.register_initializer(value)
                else:
                    constant = ir.node("Constant", [], attributes={"value": value.const_value})
                    graph.insert_before(node, constant)
                    constant.outputs[0].name = value.name
                    node.replace_input_with(index, constant.outputs[0])
                count += 1
    return count


class OptimizeKeepFunctionsPass(ir.passes.InPlacePass):
    """Run ``onnxscript.optimizer.optimize(inline=False)``: folding happens inside functions too,
    but no function is inlined, so the hierarchy survives."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import onnxscript.optimizer

        onnxscript.optimizer.optimize(model, inline=False)
        fixed = _materialize_orphan_constants(model)
        if fixed:
            log.debug("optimize: gave %d orphaned folded constants a home", fixed)
        return ir.passes.PassResult(model, modified=True)

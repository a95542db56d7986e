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


def _structure(model: ir.Model) -> list[object]:
    """What the optimizer can change, as the objects themselves (compared by identity).

    Nodes with their inputs, outputs and attributes, each graph's inputs, outputs and
    initializers (with their tensors), every function and the opset imports. Holding the objects
    keeps them alive, so an identity seen before cannot be reused by a new object.
    """
    items: list[object] = [*model.opset_imports.items(), *model.functions]
    for graph in [model.graph, *(f.graph for f in model.functions.values())]:
        items += [*graph.opset_imports.items(), "|"]
        items += [x for v in [*graph.inputs, *graph.outputs] for x in (v, v.name)]
        for name, value in graph.initializers.items():
            items += [name, value, value.const_value]
        for node in ir.traversal.RecursiveGraphIterator(graph):
            items += [node, node.op_type, node.domain, *node.inputs, "|"]
            items += [x for v in node.outputs for x in (v, v.name)]
            for key, attr in node.attributes.items():
                items += [key, attr, attr.value]
    return items


def _same(before: list[object], after: list[object]) -> bool:
    if len(before) != len(after):
        return False
    return all(
        a is b or (isinstance(a, (str, int, tuple, type(None))) and a == b)
        for a, b in zip(before, after)
    )


class OptimizeKeepFunctionsPass(ir.passes.InPlacePass):
    """Run ``onnxscript.optimizer.optimize(inline=False)``: folding happens inside functions too,
    but no function is inlined, so the hierarchy survives.

    onnxscript's optimizer does not say whether it changed anything, so the pass compares the
    model's structure (nodes, values, initializers, attributes, by identity) before and after:
    a second run reports ``modified=False``.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import onnxscript.optimizer

        before = _structure(model)
        onnxscript.optimizer.optimize(model, inline=False)
        fixed = _materialize_orphan_constants(model)
        if fixed:
            log.debug("optimize: gave %d orphaned folded constants a home", fixed)
        return ir.passes.PassResult(model, modified=not _same(before, _structure(model)))

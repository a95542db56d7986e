"""Remove function inputs that the body never reads and outputs that no call site uses.

The rule is structural, never a guess: an input is removed only if no node of the function body
consumes it (and it is not returned); an output only if, at every call site of the function, the
corresponding value has no consumer and is not a graph output. Call sites are rewritten to
match. Dead nodes left behind are removed, and the pass repeats until nothing changes, so pruning
propagates through nested functions.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.library.passes.call_sites import call_sites, drop_inputs


def _used(value: ir.Value | None) -> bool:
    return value is not None and (bool(value.uses()) or value.is_graph_output())


def _drop_outputs(node: ir.Node, keep: list[int]) -> ir.Node:
    graph = node.graph
    assert graph is not None
    new = ir.Node(
        node.domain,
        node.op_type,
        list(node.inputs),
        node.attributes.values(),
        overload=node.overload,
        num_outputs=len(keep),
        name=node.name,
    )
    for new_out, i in zip(new.outputs, keep):
        old = node.outputs[i]
        name = old.name
        old.replace_all_uses_with(new_out, replace_graph_outputs=True)
        old.name = None
        new_out.name, new_out.type, new_out.shape = name, old.type, old.shape
    new.meta.update(node.meta)
    graph.insert_before(node, new)
    graph.remove(node, safe=True)
    return new


class PruneFunctionIOPass(ir.passes.InPlacePass):
    """Prune unused inputs and outputs of every local function, with their call sites."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = RemoveUnusedNodesPass()(model).modified  # dead nodes keep inputs "used"
        while True:
            outputs_pruned = self._prune_outputs(model)
            if outputs_pruned:  # their producers may now be dead, and so may inputs they read
                RemoveUnusedNodesPass()(model)
            inputs_pruned = self._prune_inputs(model)
            if not (outputs_pruned or inputs_pruned):
                return ir.passes.PassResult(model, modified=modified)
            modified = True

    def _prune_inputs(self, model: ir.Model) -> bool:
        changed = False
        sites = call_sites(model)
        for ident, function in model.functions.items():
            inputs = function.graph.inputs
            for index in reversed(range(len(inputs))):
                if _used(inputs[index]):
                    continue
                for node in sites[ident]:
                    drop_inputs(node, (index,))
                inputs.pop(index)
                changed = True
        return changed

    def _prune_outputs(self, model: ir.Model) -> bool:
        changed = False
        all_sites = call_sites(model)
        for ident, function in model.functions.items():
            sites = all_sites[ident]
            if not sites:
                continue
            outputs = function.graph.outputs
            keep = [i for i in range(len(outputs)) if any(_used(n.outputs[i]) for n in sites)]
            if len(keep) == len(outputs) or not keep:
                continue
            for node in sites:
                _drop_outputs(node, keep)
            function.graph.outputs[:] = [outputs[i] for i in keep]
            changed = True
        return changed

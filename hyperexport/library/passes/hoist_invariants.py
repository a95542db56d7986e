"""Compute once, in the main graph, what every call of a function computes alike
(``rewrite.fuse: onnxruntime``).

A fused generation step's layers each derive the attention's bias and sizes from the mask: the
same dozen kernels in every layer's function, fed the same main-graph mask. ONNX Runtime merges
the copies when it loads the model (common subexpressions), so the kernels run once either way;
but a session that merged them runs the same final graph about 2% slower than one that loaded it
merged (``bench/README.md``), and a function that computes what its caller already has is the
wrong shape for the model anyway.

For each function whose calls are all main-graph nodes (two or more), the pass finds the inputs
every call feeds with one and the same main-graph value, and the body's nodes that read nothing
else (but ``Constant`` nodes). Those nodes move to the main graph, once, in front of the first
call. Each value of theirs that the body still reads becomes a new function input, named with
:data:`~hyperexport.base.contracts.names.INVARIANT_INPUT_PREFIX`, appended to the function's
inputs and fed at every call.

Such an input is neither captured data nor a weight. The manifest leaves it out of both, and the
check, which runs a call site alone, computes it again from that call's own captured inputs with
the main graph's nodes (``check/invariant_inputs.py``): every call site is still compared with
torch on exactly what torch gave it.

The bodies' ``Constant`` nodes move too (but where the recipe keeps constants inside the
functions, ``rewrite.fuse_constants``): ONNX Runtime would otherwise share the inlined copies at
load, which costs as much as any other change it makes then.

Nodes with subgraphs, calls of local functions and nodes reading a function attribute stay.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from hyperexport.base.contracts.names import INVARIANT_INPUT_PREFIX
from hyperexport.library.ir_nodes import copy_node
from hyperexport.library.passes.call_sites import call_sites
from hyperexport.library.passes.fuse_layout import is_op
from hyperexport.library.passes.ir_build import unique_name, value_names

log = logging.getLogger(__name__)


def _is_constant(node: ir.Node | None) -> bool:
    return is_op(node, "Constant")


def _movable(node: ir.Node, model: ir.Model) -> bool:
    """Whether a node may run in another graph: no subgraph, no local function, no reference to
    an attribute of the function it is in."""
    if node.op_identifier() in model.functions:
        return False
    for attribute in node.attributes.values():
        if attribute.is_ref() or attribute.type in (
            ir.AttributeType.GRAPH,
            ir.AttributeType.GRAPHS,
        ):
            return False
    return True


def _invariant_inputs(function: ir.Function, calls: list[ir.Node]) -> dict[int, ir.Value]:
    """``id`` of each function input that every call feeds with one main-graph value, to it."""
    invariant: dict[int, ir.Value] = {}
    for position, formal in enumerate(function.inputs):
        actuals = [c.inputs[position] if position < len(c.inputs) else None for c in calls]
        first = actuals[0]
        if first is not None and all(a is first for a in actuals):
            invariant[id(formal)] = first
    return invariant


def _hoistable(
    function: ir.Function, model: ir.Model, invariant: dict[int, ir.Value], constants: bool
) -> list[ir.Node]:
    """The body's nodes, in order, that read only invariant inputs, ``Constant`` nodes' values
    and each other's values; without ``constants``, never a ``Constant`` node nor a node that
    reads constants only (the ``Constant`` nodes stay in the body); never a function output's
    producer."""
    derived = set(invariant)
    outputs = {id(v) for v in function.outputs}
    hoisted = []
    for node in function:
        if any(id(o) in outputs for o in node.outputs):
            continue
        if _is_constant(node) and constants:
            hoisted.append(node)
            derived.update(id(o) for o in node.outputs)
            continue
        if _is_constant(node) or not _movable(node, model):
            continue
        inputs = [v for v in node.inputs if v is not None]
        if not any(id(v) in derived for v in inputs):
            continue
        if not all(id(v) in derived or _is_constant(v.producer()) for v in inputs):
            continue
        hoisted.append(node)
        derived.update(id(o) for o in node.outputs)
    return hoisted


def _hoist(
    model: ir.Model, function: ir.Function, calls: list[ir.Node], taken: set[str], constants: bool
) -> int:
    """Move ``function``'s invariant nodes in front of its first call; the count moved."""
    invariant = _invariant_inputs(function, calls)
    hoisted = _hoistable(function, model, invariant, constants)
    moved = {id(n) for n in hoisted}
    crossing = [
        o
        for node in hoisted
        for o in node.outputs
        if any(id(user) not in moved for user, _ in o.uses())
    ]
    if not crossing:
        return 0
    first_call = next(node for node in model.graph if any(node is c for c in calls))
    outer: dict[int, ir.Value] = dict(invariant)  # the body's values -> the main graph's
    made: list[ir.Node] = []

    def main_value(value: ir.Value) -> ir.Value:
        if id(value) not in outer:  # a Constant node's value: the main graph gets its own copy
            producer = value.producer()
            assert producer is not None
            outer[id(value)] = _copy(producer, [], function.name, taken, made)[0]
        return outer[id(value)]

    for node in hoisted:
        inputs = [main_value(v) if v is not None else None for v in node.inputs]
        for original, copied in zip(node.outputs, _copy(node, inputs, function.name, taken, made)):
            outer[id(original)] = copied
    model.graph.insert_before(first_call, made)
    for domain in {n.domain for n in made}:
        if domain not in model.opset_imports and domain in function.opset_imports:
            model.opset_imports[domain] = function.opset_imports[domain]

    local = value_names(function.graph)
    count = len(function.inputs)
    for value in crossing:
        formal = ir.Value(
            name=unique_name(f"{INVARIANT_INPUT_PREFIX}{value.name}", local),
            type=value.type,
            shape=value.shape,
        )
        local.add(formal.name or "")
        function.graph.inputs.append(formal)
        value.replace_all_uses_with(formal)
    for call in calls:
        arguments = [*call.inputs, *([None] * (count - len(call.inputs)))]
        arguments += [outer[id(v)] for v in crossing]
        call.resize_inputs(len(arguments))
        for i, argument in enumerate(arguments):
            call.replace_input_with(i, argument)
    function.graph.remove(hoisted, safe=True)
    unread = [
        n
        for n in function
        if _is_constant(n) and not n.outputs[0].uses() and not n.outputs[0].is_graph_output()
    ]
    function.graph.remove(unread, safe=True)  # the moved nodes' constants
    return len(hoisted)


def _copy(
    node: ir.Node,
    inputs: list[ir.Value | None],
    owner: str,
    taken: set[str],
    made: list[ir.Node],
) -> list[ir.Value]:
    """A copy of ``node`` for the main graph, reading ``inputs``; its outputs named after the
    function's."""
    name = unique_name(f"{INVARIANT_INPUT_PREFIX}{owner}/{node.name or node.op_type}", taken)
    copied = copy_node(node, inputs, name)
    taken.add(copied.name or "")
    for original, output in zip(node.outputs, copied.outputs, strict=True):
        output.name = unique_name(f"{INVARIANT_INPUT_PREFIX}{owner}.{original.name}", taken)
        output.type, output.shape = original.type, original.shape
        taken.add(output.name)
    made.append(copied)
    return list(copied.outputs)


class HoistInvariantsPass(ir.passes.InPlacePass):
    """Compute what every call of a function computes alike once, in the main graph.

    Args:
        constants: Hoist the bodies' ``Constant`` nodes too, passed in like the rest (ONNX
            Runtime would otherwise share the inlined copies at load). Off where the recipe
            asked for constants inside the functions (``rewrite.fuse_constants``).
    """

    def __init__(self, constants: bool = True) -> None:
        super().__init__()
        self.constants = constants

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sites = call_sites(model)
        taken = value_names(model.graph) | {n.name for n in model.graph if n.name}
        modified = False
        for ident, function in model.functions.items():
            calls = sites.get(ident, [])
            if len(calls) < 2 or any(c.graph is not model.graph for c in calls):
                continue
            count = _hoist(model, function, calls, taken, self.constants)
            if count:
                modified = True
                log.info(
                    "hoist_invariants: %s: %d nodes run once for its %d calls",
                    function.name,
                    count,
                    len(calls),
                )
        return ir.passes.PassResult(model, modified=modified)

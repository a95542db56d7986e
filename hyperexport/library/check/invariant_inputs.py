"""The check's side of ``passes/hoist_invariants.py``: a call site run alone computes its
invariant inputs itself.

A function input named with ``INVARIANT_INPUT_PREFIX`` is computed by the main graph, once for
every call, from values the calls pass in (the mask, say). A call site run alone has only its
captured data and its weights, so the main graph's nodes that compute the input are copied in
front of the call, reading the call's own inputs where the main graph's first call of the
function reads its arguments. The call is then compared with torch on exactly what torch gave
it, as before the pass.
"""

from __future__ import annotations

import onnx_ir as ir

from hyperexport.base.contracts.names import is_invariant_input
from hyperexport.base.errors import CheckError
from hyperexport.library.ir_nodes import copy_node


def invariant_positions(function: ir.Function) -> list[int]:
    """Positions of ``function``'s inputs that the main graph computes for every call."""
    return [i for i, v in enumerate(function.inputs) if is_invariant_input(v.name)]


def derive_invariants(
    model: ir.Model, function: ir.Function, arguments: dict[int, ir.Value]
) -> tuple[list[ir.Node], dict[int, ir.Value]]:
    """Nodes computing ``function``'s invariant inputs from a standalone call's arguments.

    Args:
        model: The final model.
        function: The called function.
        arguments: The standalone model's value for each other input position.

    Returns:
        The nodes, in order, and each invariant position's value.

    Raises:
        CheckError: When the main graph has no call of the function, or computes an invariant
            input from a value that is neither an argument of its call nor a constant.
    """
    positions = invariant_positions(function)
    if not positions:
        return [], {}
    ident = function.identifier()
    call = next((n for n in model.graph if n.op_identifier() == ident), None)
    if call is None:
        raise CheckError(
            f"{function.name}: invariant inputs, but no main-graph call of it to compute them"
        )
    known: dict[int, ir.Value] = {
        id(call.inputs[i]): v
        for i, v in arguments.items()
        if i < len(call.inputs) and call.inputs[i] is not None
    }
    nodes: list[ir.Node] = []

    def value_for(value: ir.Value) -> ir.Value:
        if id(value) in known:
            return known[id(value)]
        producer = value.producer()
        if producer is None:
            tensor = value.const_value
            if tensor is None:
                raise CheckError(
                    f"{function.name}: an invariant input reads {value.name!r}, which its call "
                    "does not pass"
                )
            producer = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)])
            nodes.append(producer)
            known[id(value)] = producer.outputs[0]
            return producer.outputs[0]
        copied = copy_node(
            producer, [value_for(v) if v is not None else None for v in producer.inputs]
        )
        for original, output in zip(producer.outputs, copied.outputs, strict=True):
            output.name = f"derived_{original.name}"
            known[id(original)] = output
        nodes.append(copied)
        return known[id(value)]

    derived = {}
    for position in positions:
        source = call.inputs[position] if position < len(call.inputs) else None
        if source is None:
            raise CheckError(f"{function.name}: its call passes no invariant input {position}")
        derived[position] = value_for(source)
    return nodes, derived

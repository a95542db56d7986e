"""Nodes a pass inserts into a graph or function body, before the node that will read them, and
the fresh names it gives new values."""

from __future__ import annotations

import onnx_ir as ir


def insert_op(
    owner: ir.Graph | ir.Function,
    before: ir.Node,
    op_type: str,
    inputs: list[ir.Value],
    name: str,
    **ints: int,
) -> ir.Value:
    """A default-domain ``op_type`` node named ``name``, with integer attributes, before
    ``before``; its first output."""
    attributes = [ir.AttrInt64(k, v) for k, v in ints.items()]
    node = ir.Node("", op_type, inputs, attributes, name=name)
    owner.insert_before(before, node)
    return node.outputs[0]


def insert_ints(
    owner: ir.Graph | ir.Function, before: ir.Node, values: list[int], name: str
) -> ir.Value:
    """A ``Constant`` of ``values`` (1-D int64) named ``name``, before ``before``."""
    node = ir.Node("", "Constant", [], [ir.AttrInt64s("value_ints", values)], name=name)
    owner.insert_before(before, node)
    return node.outputs[0]


def insert_tensor(
    owner: ir.Graph | ir.Function, before: ir.Node, value: ir.TensorProtocol, name: str
) -> ir.Value:
    """A ``Constant`` of the tensor ``value`` named ``name``, before ``before``."""
    node = ir.Node("", "Constant", [], [ir.AttrTensor("value", value)], name=name)
    owner.insert_before(before, node)
    return node.outputs[0]


def value_names(graph: ir.Graph) -> set[str]:
    """Every value name of ``graph``: inputs, initializers, node outputs."""
    taken = {v.name for v in graph.inputs if v.name} | set(graph.initializers)
    taken |= {o.name for node in graph for o in node.outputs if o.name}
    return taken


def unique_name(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with a suffix when ``taken`` holds it."""
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}.{i}", i + 1
    return candidate


def fresh_name(name: str, graph: ir.Graph) -> str:
    """``name``, or ``name`` with a suffix when ``graph`` (a main graph or a function's) already
    has a value of that name."""
    return unique_name(name, value_names(graph))

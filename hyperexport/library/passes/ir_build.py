"""Nodes a pass inserts into a graph or function body, before the node that will read them."""

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

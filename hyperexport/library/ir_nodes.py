"""onnx_ir node helpers that the passes and the check share (the check imports no pass: its
stage's key). No torch here."""

from __future__ import annotations

import onnx_ir as ir


def copy_node(node: ir.Node, inputs: list[ir.Value | None], name: str | None = None) -> ir.Node:
    """A copy of ``node`` (op, version, attributes of its own) reading ``inputs``, in no graph."""
    return ir.Node(
        node.domain,
        node.op_type,
        inputs,
        attributes=[ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
        num_outputs=len(node.outputs),
        version=node.version,
        name=name,
    )

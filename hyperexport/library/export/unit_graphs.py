"""Tell exported unit graphs apart by what they compute, not by how they are named.

Two hiera calls of one class that differ in something their forward reads (a submodule that is
``Identity`` in one layer and an eval-mode ``DropPath`` in the next, say) get separate units,
since the capture cannot know whether the difference reaches the graph. Once both are exported,
:func:`graph_digest` can: it hashes the nodes (op, domain, attributes, constant values, how
each input is wired), the graph's inputs and outputs with their types, and every initializer
that is not one of the unit's weights by value. Weights are compared by name only: in per-type
mode each instance passes its own. Value and node names, which carry module paths, are left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

import onnx_ir as ir


def graph_digest(model: ir.Model, weights: Collection[str]) -> str:
    """sha256 of what ``model``'s graph computes, with ``weights`` (initializer names) by name."""
    digest = hashlib.sha256()
    for part in _graph_parts(model.graph, set(weights)):
        digest.update(repr(part).encode())
        digest.update(b"\0")
    digest.update(repr(sorted(model.opset_imports.items())).encode())
    return digest.hexdigest()


def _graph_parts(graph: ir.Graph, weights: set[str]) -> list[Any]:
    """The graph's inputs, then each output as a Merkle hash of what computes it.

    A node is named by the hash of its op, attributes and its inputs' names, so the digest
    holds for any topological order of the nodes (the dynamo path's units list shared
    constants first or later, depending on the order units ran in the batch).
    """
    ids: dict[int, str] = {}
    parts: list[Any] = []
    for index, value in enumerate(graph.inputs):
        ids[id(value)] = f"in{index}"
        parts.append(("input", index, str(value.type), str(value.shape)))
    for name, value in graph.initializers.items():
        if name in weights or value.const_value is None:
            ids[id(value)] = repr(("weight", name, str(value.type), str(value.shape)))
        else:
            data = value.const_value.numpy()
            ids[id(value)] = _hash(("init", str(data.dtype), data.shape, data.tobytes()))
    for node in graph:
        inputs: list[str | None] = []
        for source in node.inputs:
            if source is None:
                inputs.append(None)
            elif id(source) in ids:
                inputs.append(ids[id(source)])
            else:  # an outer-scope value (subgraphs) or a dangling one: by name
                inputs.append(f"outer:{source.name}")
        attributes = [(name, _attribute(attr, weights)) for name, attr in node.attributes.items()]
        key = _hash((node.domain, node.op_type, node.overload, inputs, sorted(attributes)))
        for o, value in enumerate(node.outputs):
            ids[id(value)] = f"{key}.{o}"
    for index, value in enumerate(graph.outputs):
        parts.append(("output", index, ids.get(id(value)), str(value.type), str(value.shape)))
    return parts


def _hash(part: Any) -> str:
    return hashlib.sha256(repr(part).encode()).hexdigest()[:32]


def _attribute(attr: ir.Attr, weights: set[str]) -> Any:
    if attr.is_ref():
        return ("ref", attr.ref_attr_name)
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        data = value.numpy()
        return ("tensor", str(data.dtype), data.shape, data.tobytes())
    if attr.type == ir.AttributeType.GRAPH:
        return ("graph", _graph_parts(value, weights))
    if attr.type == ir.AttributeType.GRAPHS:
        return ("graphs", [_graph_parts(g, weights) for g in value])
    if attr.type == ir.AttributeType.TENSORS:
        return ("tensors", [(t.numpy().tobytes(), t.numpy().shape) for t in value])
    return (str(attr.type), repr(value))

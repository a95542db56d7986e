"""Shared helpers of the passes that rewrite functions together with their call sites."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import onnx_ir as ir


def graphs(model: ir.Model) -> Iterator[ir.Graph]:
    """The main graph, then every function's graph."""
    yield model.graph
    for function in model.functions.values():
        yield function.graph


def call_sites(model: ir.Model) -> dict[ir.OperatorIdentifier, list[ir.Node]]:
    """Every local function's call nodes (main graph, functions and their subgraphs), found in
    one walk over the model."""
    sites: dict[ir.OperatorIdentifier, list[ir.Node]] = {ident: [] for ident in model.functions}
    for graph in graphs(model):
        for node in graph.all_nodes():
            calls = sites.get(node.op_identifier())
            if calls is not None:
                calls.append(node)
    return sites


def drop_inputs(node: ir.Node, positions: Iterable[int]) -> None:
    """Remove the inputs at ``positions`` from ``node``, keeping the others in order."""
    drop = set(positions)
    kept = [v for i, v in enumerate(node.inputs) if i not in drop]
    for i, value in enumerate(kept):
        node.replace_input_with(i, value)
    node.resize_inputs(len(kept))


def insert_input(node: ir.Node, position: int, value: ir.Value | None) -> None:
    """Insert ``value`` as ``node``'s input at ``position``, the later inputs one further on."""
    values = list(node.inputs)
    values.insert(position, value)
    node.resize_inputs(len(values))
    for i, item in enumerate(values):
        node.replace_input_with(i, item)

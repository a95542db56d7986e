"""Rename hyperexport's functions to HyperONNX's convention: ``Class:idx`` in its own domain.

hyperexport names a function after its class (``Block``, or ``Block_layers_0`` per instance) in
domain ``hyperexport.fn``; HyperONNX names them ``Block:0``, ``Block:1``... in domain ``hyper``.
Indices count the functions of one class in the order the model lists them. Call sites in the
main graph and inside functions follow, and so does every opset import of the domain.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import onnx

from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN

#: ``FunctionProto.metadata_props`` key of the module class (see passes/compose_functions.py).
MODULE_CLASS_KEY = "hyperexport.module_class"


def _class_of(function: onnx.FunctionProto) -> str:
    for prop in function.metadata_props:
        if prop.key == MODULE_CLASS_KEY:
            return prop.value.rpartition(".")[2]
    return function.name.split("_")[0]  # functions not made from a module (folded leftovers)


def _nodes(proto: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    def of(nodes: Any) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for attr in node.attribute:
                if attr.HasField("g"):
                    yield from of(attr.g.node)
                for graph in attr.graphs:
                    yield from of(graph.node)

    yield from of(proto.graph.node)
    for function in proto.functions:
        yield from of(function.node)


def _rename_domain(imports: Any, domain: str) -> None:
    for opset in imports:
        if opset.domain == FUNCTION_DOMAIN:
            opset.domain = domain


def rename_functions(proto: onnx.ModelProto, domain: str) -> dict[str, str]:
    """Rename every hyperexport function of ``proto`` in place to ``Class:idx`` in ``domain``.

    Returns:
        ``{old name: new name}``.
    """
    renamed: dict[str, str] = {}
    counts: dict[str, int] = {}
    for function in proto.functions:
        if function.domain != FUNCTION_DOMAIN:
            continue
        cls = _class_of(function)
        index = counts.get(cls, 0)
        counts[cls] = index + 1
        renamed[function.name] = f"{cls}:{index}"
        function.name = renamed[function.name]
        function.domain = domain
        _rename_domain(function.opset_import, domain)
    for node in _nodes(proto):
        if node.domain == FUNCTION_DOMAIN and node.op_type in renamed:
            node.op_type = renamed[node.op_type]
            node.domain = domain
    _rename_domain(proto.opset_import, domain)
    return renamed

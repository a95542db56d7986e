"""Write the final ONNX model (and its external data) atomically. No torch here."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx_ir as ir


def save_model(model: ir.Model, path: Path, *, external_data: bool, threshold: int = 1024) -> None:
    """Write ``model`` to ``path`` atomically.

    With ``external_data``, every tensor of at least ``threshold`` bytes goes to
    ``<name>.data`` beside the model: initializers, and also the Constant tensors inside
    functions (per-instance weights). The data file is moved into place first and the model
    last, so a reader never sees a model without its data. Nothing depends on the working
    directory, and an earlier export's files at ``path`` are replaced.
    """
    import onnx
    from onnx.external_data_helper import set_external_data, write_external_data_tensors

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    proto = ir.serde.serialize_model(model)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        staged = Path(tmp) / path.name
        data = Path(tmp) / f"{path.name}.data"
        if external_data:
            moved = 0
            for tensor in _all_tensors(proto):
                if tensor.HasField("raw_data") and len(tensor.raw_data) >= threshold:
                    set_external_data(tensor, data.name)
                    moved += 1
            if moved:
                write_external_data_tensors(proto, tmp)
        onnx.save_model(proto, staged)
        if data.exists():
            os.replace(data, path.parent / data.name)
        os.replace(staged, path)


def _all_tensors(proto: Any) -> Iterator[Any]:
    """Every TensorProto of a model: initializers and tensor attributes, in graphs and functions."""

    def of_nodes(nodes: Any) -> Iterator[Any]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for graph in attr.graphs:
                    yield from of_graph(graph)

    def of_graph(graph: Any) -> Iterator[Any]:
        yield from graph.initializer
        yield from of_nodes(graph.node)

    yield from of_graph(proto.graph)
    for function in proto.functions:
        yield from of_nodes(function.node)

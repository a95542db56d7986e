"""Part of a generation step's main graph as a model of its own, for ONNX Runtime to evaluate.

The passes that replace a main-graph computation by a cheaper one (``padding_mask.py``: the
attention mask; ``rotary_tables.py``: the rotary tables) do not match the computation's nodes,
which transformers' releases build differently: they evaluate what the graph computes on probe
inputs and compare. :func:`subgraph` cuts the nodes a value is computed from out of the main
graph: at the step's inputs, at small constants, and at values of known sizes that only
``Shape`` nodes read (fed as zeros of those sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.library.passes.fuse_layout import is_op
from hyperexport.library.passes.share_kv_buffer import ATTENTION_MASK, INPUT_IDS, PAST_NAME

#: The main graph's position input (``KVStep``), which probes feed as transformers makes it.
POSITION_IDS = "position_ids"
#: The sizes a probe gives each named dimension of the step's inputs, by (input, axis).
BATCH, NEW, TOTAL, PAST = "batch", "new", "total", "past"
#: A constant the subgraph reads may hold at most this many elements.
CONSTANT_ELEMENTS = 1 << 20


class Unprobeable(Exception):
    """The subgraph reads what a probe cannot feed."""


@dataclass(frozen=True)
class Subgraph:
    """Main-graph nodes as a model, and its inputs.

    Attributes:
        model: The subgraph; its inputs are the graph inputs it reads and the values whose
            shape alone it reads (``Shape`` of the embeddings, say).
        inputs: Each of the model's inputs: (name, dtype, dims), a dim a number or a size name
            (:data:`BATCH`, ...), or None for a graph input whose size the probe chooses.
    """

    model: onnx.ModelProto
    inputs: tuple[tuple[str, np.dtype, tuple[int | str, ...] | None], ...]


def size_names(graph: ir.Graph) -> dict[str, str]:
    """The step inputs' named dimensions, as probe sizes: input_ids' (batch, new), the mask's
    (batch, total), a past's batch and rows."""
    axes: dict[str, tuple[str, ...]] = {
        INPUT_IDS: (BATCH, NEW),
        POSITION_IDS: (BATCH, NEW),
        ATTENTION_MASK: (BATCH, TOTAL),
    }
    names: dict[str, str] = {}
    for value in graph.inputs:
        shape = value.shape
        if shape is None:
            continue
        sizes = axes.get(value.name or "")
        if sizes is None and PAST_NAME.match(value.name or "") and len(shape) == 4:
            sizes = (BATCH, "", PAST, "")
        for dim, size in zip(shape, sizes or ()):
            if size and isinstance(dim, ir.SymbolicDim) and dim.value:
                names.setdefault(dim.value, size)
    return names


def _dims(value: ir.Value, names: dict[str, str]) -> tuple[int | str, ...] | None:
    """``value``'s shape as numbers and probe sizes; None where a dim is neither."""
    if value.shape is None:
        return None
    dims: list[int | str] = []
    for dim in value.shape:
        if isinstance(dim, int):
            dims.append(dim)
        elif isinstance(dim, ir.SymbolicDim) and dim.value in names:
            dims.append(names[dim.value])
        else:
            return None
    return tuple(dims)


def ancestry(graph: ir.Graph, values: Sequence[ir.Value]) -> set[int]:
    """The ids of the nodes of ``graph`` (a main graph or a function's) ``values`` are
    computed from."""
    found: set[int] = set()
    stack = list(values)
    while stack:
        producer = stack.pop().producer()
        if producer is None or producer.graph is not graph or id(producer) in found:
            continue
        found.add(id(producer))
        stack.extend(v for v in producer.inputs if v is not None)
    return found


def subgraph(
    model: ir.Model,
    outputs: Sequence[ir.Value],
    name: str,
    elem_type: int | None = None,
    unsized: tuple[str, ...] = (ATTENTION_MASK, POSITION_IDS),
) -> Subgraph:
    """The main-graph nodes ``outputs`` are computed from, as a model named ``name``.

    Args:
        model: The model (its shapes inferred: ``fuse_values.annotated``).
        outputs: The values the subgraph computes.
        name: The subgraph's graph name.
        elem_type: The outputs' element type; None: each output's own (known) type.
        unsized: Graph inputs the subgraph may read whose sizes the probe chooses.

    Raises:
        Unprobeable: The outputs are computed from what a probe cannot feed (another input,
            a large initializer, a kernel of another domain), or their types are unknown.
    """
    graph = model.graph
    names = size_names(graph)
    everything = ancestry(graph, outputs)
    nodes: list[ir.Node] = []
    seen: set[int] = set()
    inputs: dict[str, tuple[ir.Value, tuple[int | str, ...] | None]] = {}
    constants: dict[str, ir.Value] = {}

    def sized_only(read: ir.Value) -> tuple[int | str, ...] | None:
        """``read``'s probe sizes, if only Shape nodes of the subgraph read it."""
        dims = _dims(read, names)
        if dims is None or read.dtype is None or read.is_initializer():
            return None
        readers = [u.node for u in read.uses() if id(u.node) in everything]
        return dims if all(is_op(n, "Shape") for n in readers) else None

    stack = list(outputs)
    while stack:
        current = stack.pop()
        read = current.name or ""
        if not read:
            raise Unprobeable("it is computed from a value without a name")
        if read in inputs or read in constants:
            continue
        if current.is_graph_input():
            dims = _dims(current, names)
        else:  # an output is computed, whatever reads it
            dims = None if any(current is v for v in outputs) else sized_only(current)
        if current.is_graph_input() or dims is not None:
            if read not in unsized and dims is None:
                raise Unprobeable(f"it reads the input {read!r}, which the probes cannot size")
            inputs[read] = (current, dims)
            continue
        if current.is_initializer():
            tensor = current.const_value
            if tensor is None or tensor.size > CONSTANT_ELEMENTS:
                raise Unprobeable(f"it reads the initializer {read!r}")
            constants[read] = current
            continue
        producer = current.producer()
        if producer is None or id(producer) in seen:
            continue
        if producer.graph is not graph or producer.domain not in ("", "ai.onnx"):
            raise Unprobeable(f"it is computed by {producer.op_type} of {producer.domain!r}")
        seen.add(id(producer))
        nodes.append(producer)
        stack.extend(v for v in producer.inputs if v is not None)
    order = {id(n): i for i, n in enumerate(graph)}
    nodes.sort(key=lambda n: order[id(n)])
    for value, _ in inputs.values():
        if value.dtype is None:
            raise Unprobeable(f"it reads {value.name!r}, whose type is unknown")
    types = []
    for value in outputs:
        if elem_type is None and value.dtype is None:
            raise Unprobeable(f"the type of {value.name!r} is unknown")
        types.append(elem_type if elem_type is not None else int(value.dtype))  # type: ignore[arg-type]
    proto = probe_model(
        model,
        name,
        nodes,
        [ir.serde.serialize_value(value) for value, _ in inputs.values()],
        [
            onnx.helper.make_tensor_value_info(value.name or "", kind, None)
            for value, kind in zip(outputs, types, strict=True)
        ],
        [ir.serde.serialize_tensor(_loaded(v)) for v in constants.values()],
    )
    return Subgraph(
        proto,
        tuple(
            (read, value.dtype.numpy(), dims)  # type: ignore[union-attr]
            for read, (value, dims) in inputs.items()
        ),
    )


def probe_model(
    model: ir.Model,
    name: str,
    nodes: Sequence[ir.Node],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """``nodes`` (default-domain, of ``model``'s main graph or a function body) as a model of
    their own, at ``model``'s opset and IR version: the installed ONNX Runtime may read no newer
    one than the model it runs."""
    return onnx.helper.make_model(
        onnx.helper.make_graph(
            [ir.serde.serialize_node(n) for n in nodes],
            name,
            list(inputs),
            list(outputs),
            list(initializers),
        ),
        opset_imports=[onnx.helper.make_opsetid("", model.opset_imports.get("", 18))],
        ir_version=model.ir_version,
    )


def probe_session(proto: onnx.ModelProto) -> Any:
    """An ONNX Runtime CPU session of a probe model (imported here: only a probe needs it)."""
    import onnxruntime as ort

    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def _loaded(value: ir.Value) -> ir.TensorProtocol:
    """A constant's tensor with its bytes in memory (a probe model has no external data)."""
    tensor = value.const_value
    assert tensor is not None  # subgraph
    return ir.tensor(tensor.numpy(), name=value.name)

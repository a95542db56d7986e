"""Sizes and types read off the inputs every call shares, after the ``onnxruntime`` fusion.

A layer function's kernels need sizes: ``GroupQueryAttention`` the batch, the new tokens and the
total length, the shared KV buffer its valid length. The fusion rules read them off the layer's
own values (``Shape`` of a projection), so each layer computes them again, and the mask's
``attention_bias`` too (``Where`` of the mask, typed ``CastLike`` a projection): after ONNX
Runtime inlines the functions these are different nodes per layer, with different inputs, and
nothing merges them (profiled: about 20 of the 40 kernels a fused Llama layer runs per step).

Some inputs are the same main-graph value at every call site (the attention mask, the rotary
``cos`` and ``sin``). :func:`read_shared` reads a size off such an input where the inferred
shapes give it the same dimension (the same named dimension, or the same number), and types a
``CastLike`` after such an input of the same element type. Then every layer's copy has the same
inputs, and ONNX Runtime's common-subexpression elimination keeps one. Named dimensions are
the exporter's: it names each dynamic axis of the model's inputs once, and shape inference
carries the names through; the check compares every call site and the whole model with torch
afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from hyperexport.library.passes.fuse_layout import is_op, read_axis, shape_of
from hyperexport.library.passes.fuse_values import annotated, dtype, ints


def read_shared(model: ir.Model) -> int:
    """Read sizes and ``CastLike`` types off the inputs each function's call sites share.
    Returns how many reads moved."""
    moved = 0
    shared = shared_inputs(model)
    with annotated(model):
        for key, function in model.functions.items():
            sources = [v for v in shared.get(key, ()) if v.shape is not None]
            for node in list(function):
                if is_op(node, "Shape") and node.inputs[0] not in sources:
                    moved += _read_size(function, node, sources)
                elif is_op(node, "CastLike") and node.inputs[1] not in sources:
                    moved += _type_from(node, sources)
    # Shapes inferred again: a piece's length is known once it is read off a shared input.
    with annotated(model):
        for key, function in model.functions.items():
            if shared.get(key):
                for node in list(function):
                    if is_op(node, "Gather"):
                        moved += _gather_from_piece(function, node)
    return moved


def _gather_from_piece(owner: ir.Function, gather: ir.Node) -> int:
    """``Gather(Concat(p0, p1, ...), i)`` of 1-D pieces of known lengths -> ``Gather(pk, j)``:
    the element read from the piece that holds it (the shared buffer's valid shape is
    assembled from the past's own sizes and the mask's; the kernel reads only the mask's)."""
    data, index = gather.inputs[0], gather.inputs[1]
    concat = data.producer() if data is not None else None
    at = ints(index)
    if concat is None or not is_op(concat, "Concat") or at is None or len(at) != 1 or at[0] < 0:
        return 0
    if gather.attributes.get_int("axis", 0) != 0 or concat.attributes.get_int("axis", 0) != 0:
        return 0
    offset = 0
    for piece in concat.inputs:
        length = _length(piece)
        if length is None:
            return 0
        if offset <= at[0] < offset + length:
            scalar = index is not None and index.shape is not None and index.shape.rank() == 0
            local = np.asarray(at[0] - offset if scalar else [at[0] - offset], dtype=np.int64)
            constant = ir.node("Constant", [], attributes={"value": ir.tensor(local)})
            owner.insert_before(gather, constant)
            gather.replace_input_with(0, piece)
            gather.replace_input_with(1, constant.outputs[0])
            return 1
        offset += length
    return 0


def _length(piece: ir.Value | None) -> int | None:
    """The length of a 1-D value, when its shape says."""
    if piece is None or piece.shape is None or piece.shape.rank() != 1:
        return None
    length = piece.shape[0]
    return length if isinstance(length, int) else None


def shared_inputs(model: ir.Model) -> dict[ir.OperatorIdentifier, list[ir.Value]]:
    """For each function called from the main graph, its inputs that every call site (all in
    the main graph) feeds the same value; none for a function called from another function."""
    calls: dict[ir.OperatorIdentifier, list[ir.Node]] = {}
    for node in model.graph:
        if node.op_identifier() in model.functions:
            calls.setdefault(node.op_identifier(), []).append(node)
    nested = {
        node.op_identifier()
        for function in model.functions.values()
        for node in function
        if node.op_identifier() in model.functions
    }
    found: dict[ir.OperatorIdentifier, list[ir.Value]] = {}
    for key, sites in calls.items():
        if key in nested:
            continue
        inputs = model.functions[key].inputs
        found[key] = [
            inputs[k]
            for k in range(len(inputs))
            if _same_argument([site.inputs[k] if k < len(site.inputs) else None for site in sites])
        ]
    return found


def _same_argument(arguments: Sequence[ir.Value | None]) -> bool:
    return arguments[0] is not None and all(a is arguments[0] for a in arguments)


def _read_size(owner: ir.Function, shape: ir.Node, sources: Sequence[ir.Value]) -> int:
    """Point ``Shape(v)`` (one axis by ``start``/``end``), or each ``Gather`` of one axis of
    it, at a source with the same dimension."""
    value = shape.inputs[0]
    dims = shape_of(value)
    if value is None or dims is None:
        return 0
    start, end = _range(shape, dims.rank())
    if end - start == 1:
        found = _source_of(dims[start], sources)
        if found is None:
            return 0
        source, read = found
        shape.replace_input_with(0, source)
        shape.attributes["start"] = ir.AttrInt64("start", read)
        shape.attributes["end"] = ir.AttrInt64("end", read + 1)
        return 1
    if start != 0 or end != dims.rank():
        return 0
    moved = 0
    for gather, index in list(shape.outputs[0].uses()):
        gathered = ints(gather.inputs[1]) if is_op(gather, "Gather") and index == 0 else None
        if gathered is None or len(gathered) != 1 or gather.attributes.get_int("axis", 0) != 0:
            continue
        found = _source_of(dims[gathered[0]], sources)
        if found is None:
            continue
        read_axis(owner, gather, *found)
        moved += 1
    return moved


def _range(shape: ir.Node, rank: int) -> tuple[int, int]:
    """The axes ``[start, end)`` a ``Shape`` node returns, normalised."""
    start = shape.attributes.get_int("start", 0)
    end = shape.attributes.get_int("end", rank)
    start = max(0, start + rank if start < 0 else start)
    end = min(rank, end + rank if end < 0 else end)
    return start, end


def _source_of(
    dim: int | ir.SymbolicDim, sources: Sequence[ir.Value]
) -> tuple[ir.Value, int] | None:
    """A source and the axis of it that has dimension ``dim`` (a named one: a number is a
    constant ONNX Runtime folds anyway)."""
    if isinstance(dim, int) or dim.value is None:
        return None
    for source in sources:
        for axis, other in enumerate(source.shape or ()):
            if isinstance(other, ir.SymbolicDim) and other.value == dim.value:
                return source, axis
    return None


def _type_from(node: ir.Node, sources: Sequence[ir.Value]) -> int:
    """``CastLike(x, v)`` -> ``CastLike(x, s)`` for a source ``s`` of ``v``'s element type."""
    wanted = dtype(node.inputs[1])
    if wanted is None:
        return 0
    for source in sources:
        if dtype(source) == wanted:
            node.replace_input_with(1, source)
            return 1
    return 0


class ReadSharedSizesPass(ir.passes.InPlacePass):
    """:func:`read_shared` as a pass: after the ``onnxruntime`` fusion and the shared KV buffer,
    whose bookkeeping reads sizes too."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=bool(read_shared(model)))

"""A fused generation step's attention sizes in the fewest kernels (``rewrite.fuse:
onnxruntime``).

``GroupQueryAttention`` over a shared buffer takes three sizes: ``total_sequence_length``
(the mask's length), ``seqlens_k`` (that less one, per batch entry: the padding is in the bias)
and ``query_seqlens`` (the new tokens, per entry). The fusion rules and the shared buffer
compute them as they find them (the past's valid length plus the new tokens, cast, reshaped and
broadcast), about 16 kernels per step once ONNX Runtime has merged the layers' copies, against
the 6 of the builder's step (``bench/README.md``).

When every one of the three is computed from the 4-D mask's shape alone (after
``shared_sizes``), this pass evaluates them with ONNX Runtime for several (batch, new, total)
probes and, where each is what the kernel's contract says (``total``; ``total - 1`` and
``new`` per entry, in their types and ranks), computes them again from ``Shape(mask)``: one
``Shape`` and ``Cast``, then ``Gather``, ``Sub`` and ``Expand``, 9 kernels. A size computed from
anything else, or that differs on a probe, is left as it was (DEBUG). The check stage compares
every call site and the whole model with torch afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.library.passes.fuse_layout import ATTENTION_KERNEL
from hyperexport.library.passes.fuse_values import annotated
from hyperexport.library.passes.graph_probe import probe_model, probe_session
from hyperexport.library.passes.ir_build import insert_ints, insert_op, insert_tensor
from hyperexport.library.passes.ort_kernels import GQA_INPUTS, MS_DOMAIN

log = logging.getLogger(__name__)

_SEQLENS = GQA_INPUTS.index("seqlens_k")
_TOTAL = GQA_INPUTS.index("total_sequence_length")
_QUERY_SEQLENS = GQA_INPUTS.index("query_seqlens")
#: (batch, new, total) of the probes: a first prompt, a chunk and decode steps over a past.
PROBES = ((1, 1, 1), (1, 5, 5), (2, 3, 9), (3, 1, 40))
#: The mask's axes: (batch, 1, new, total).
_BATCH_AXIS, _NEW_AXIS, _TOTAL_AXIS = 0, 2, 3


def expected_sizes(batch: int, new: int, total: int) -> tuple[np.ndarray, ...]:
    """``seqlens_k``, ``total_sequence_length``, ``query_seqlens`` as the kernel reads them."""
    return (
        np.full(batch, total - 1, np.int32),
        np.array(total, np.int32),
        np.full(batch, new, np.int32),
    )


def _is_attention(node: ir.Node) -> bool:
    return node.domain == MS_DOMAIN and node.op_type == ATTENTION_KERNEL


def _sizes(attention: ir.Node) -> list[ir.Value] | None:
    inputs = list(attention.inputs)
    if len(inputs) <= _QUERY_SEQLENS:
        return None
    sizes = [inputs[i] for i in (_SEQLENS, _TOTAL, _QUERY_SEQLENS)]
    return sizes if all(v is not None for v in sizes) else None  # type: ignore[return-value]


def _mask_of(
    function: ir.Function, sizes: Sequence[ir.Value]
) -> tuple[ir.Value, list[ir.Node]] | None:
    """The one 4-D function input whose shape alone the sizes are computed from, and the
    nodes that compute them (in the function's order); None where anything else is read."""
    formals = {id(v) for v in function.inputs}
    read: set[int] = set()
    nodes: dict[int, ir.Node] = {}
    stack = list(sizes)
    while stack:
        value = stack.pop()
        node = value.producer()
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if id(node) in nodes:
            continue
        nodes[id(node)] = node
        for item in node.inputs:
            if item is None:
                continue
            if id(item) in formals:
                if node.op_type != "Shape":
                    return None
                read.add(id(item))
            else:
                stack.append(item)
    masks = [v for v in function.inputs if id(v) in read]
    if len(masks) != 1 or masks[0].shape is None or len(masks[0].shape) != 4:
        return None
    order = {id(n): i for i, n in enumerate(function)}
    return masks[0], sorted(nodes.values(), key=lambda n: order[id(n)])


def _agree(
    mask: ir.Value, nodes: Sequence[ir.Node], sizes: Sequence[ir.Value], model: ir.Model
) -> bool:
    """Whether the sizes are the kernel's contract on every probe (evaluated by ONNX Runtime
    at ``model``'s opset and IR version: the installed ONNX Runtime may read no newer one)."""
    names = [v.name or "" for v in sizes]
    if not all(names) or not mask.name or mask.dtype is None or any(v.dtype is None for v in sizes):
        return False
    proto = probe_model(
        model,
        "attention_sizes_probe",
        nodes,
        [onnx.helper.make_tensor_value_info(mask.name, int(mask.dtype), None)],
        [
            onnx.helper.make_tensor_value_info(n, int(v.dtype), None)  # type: ignore[arg-type]
            for n, v in zip(names, sizes, strict=True)
        ],
    )
    session = probe_session(proto)
    for batch, new, total in PROBES:
        feed = np.zeros((batch, 1, new, total), mask.dtype.numpy())
        got = session.run(None, {mask.name: feed})
        for g, e in zip(got, expected_sizes(batch, new, total), strict=True):
            if g.dtype != e.dtype or g.shape != e.shape or not np.array_equal(g, e):
                return False
    return True


#: The name suffix of the node that gives the rebuilt ``total_sequence_length``.
_TOTAL_ROLE = "total"


def _rebuilt(total: ir.Value) -> bool:
    """Whether ``total`` is what :func:`_rebuild` made."""
    producer = total.producer()
    return producer is not None and (producer.name or "").endswith(f"_sizes_{_TOTAL_ROLE}")


def _rebuild(function: ir.Function, attention: ir.Node, mask: ir.Value) -> None:
    """The three sizes from ``Shape(mask)`` before ``attention``."""
    stem = attention.name or "attention"

    def op(kind: str, inputs: list[ir.Value], role: str, **attributes: int) -> ir.Value:
        return insert_op(function, attention, kind, inputs, f"{stem}_sizes_{role}", **attributes)

    def ints(values: list[int], role: str) -> ir.Value:
        return insert_ints(function, attention, values, f"{stem}_sizes_{role}")

    shape = op("Shape", [mask], "shape")
    shape32 = op("Cast", [shape], "shape32", to=int(ir.DataType.INT32))
    batch = op("Gather", [shape, ints([_BATCH_AXIS], "batch_axis")], "batch", axis=0)
    total_at = insert_op(
        function, attention, "Constant", [], f"{stem}_sizes_total_at", value_int=_TOTAL_AXIS
    )
    total = op("Gather", [shape32, total_at], _TOTAL_ROLE, axis=0)
    totals = op("Gather", [shape32, ints([_TOTAL_AXIS], "total_axis")], "totals", axis=0)
    one = insert_tensor(
        function, attention, ir.tensor(np.array([1], np.int32)), f"{stem}_sizes_one"
    )
    last = op("Sub", [totals, one], "last")
    seqlens = op("Expand", [last, batch], "seqlens_k")
    new = op("Gather", [shape32, ints([_NEW_AXIS], "new_axis")], "new", axis=0)
    query = op("Expand", [new, batch], "query_seqlens")
    attention.replace_input_with(_SEQLENS, seqlens)
    attention.replace_input_with(_TOTAL, total)
    attention.replace_input_with(_QUERY_SEQLENS, query)


class AttentionSizesPass(ir.passes.InPlacePass):
    """The fewest kernels for every ``GroupQueryAttention``'s sizes (module docstring)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not any(
            _is_attention(node) and _sizes(node) is not None
            for function in model.functions.values()
            for node in function
        ):  # no attention over a cache: no shape inference either
            return ir.passes.PassResult(model, modified=False)
        with annotated(model):  # the sizes' types, for the probe
            rebuilt = self._rebuild_all(model)
        if rebuilt:
            RemoveUnusedNodesPass()(model)
            log.info("attention sizes: %d attentions' sizes read off the mask's shape", rebuilt)
        return ir.passes.PassResult(model, modified=bool(rebuilt))

    @staticmethod
    def _rebuild_all(model: ir.Model) -> int:
        rebuilt = 0
        for function in model.functions.values():
            for attention in list(function):
                if not _is_attention(attention):
                    continue
                sizes = _sizes(attention)
                if sizes is not None and _rebuilt(sizes[1]):
                    continue
                found = _mask_of(function, sizes) if sizes is not None else None
                if sizes is None or found is None or not _agree(*found, sizes, model):
                    log.debug("attention sizes: %s: %s kept", function.name, attention.name)
                    continue
                _rebuild(function, attention, found[0])
                rebuilt += 1
        return rebuilt

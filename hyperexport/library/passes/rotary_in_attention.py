"""Each generation step's rotary embedding inside its ``GroupQueryAttention`` (``do_rotary``),
with the packed projection as the kernel's query, as onnxruntime-genai's builder runs a layer
(``rewrite.fuse: onnxruntime``).

After the fusion a decoder layer's step reads, for its attention:

    qkv = MatMul(x, packed weights); q, k, v = Split(qkv)
    GroupQueryAttention(RotaryEmbedding(q, positions, cos, sin),
                        RotaryEmbedding(k, positions, cos, sin), v, past..., query_seqlens)

and becomes one kernel on ``qkv``: ``GroupQueryAttention(qkv, -, -, past..., cos, sin,
positions, ..., query_seqlens, do_rotary=1)``, three kernels fewer per layer (4% of an int4 step
at 8 layers and hidden 256, ``bench/README.md``).

Why that computes the same: ``cos``/``sin`` are the per-token rows ``fuse_rotary`` made
(``batch * seq`` rows, ``positions`` numbering them), and with ``query_seqlens`` the kernel
rotates every token, the first prompt's too, by the row ``position_ids`` names (without
``query_seqlens`` a first prompt is rotated by its token's index, which is not transformers'
position in a left-padded row). The kernel wants at least ``total_sequence_length`` rows in its
tables, so they are padded with zero rows that no position names: a decode step writes
``2 * total * head / 2`` floats more, against the ``2 * layers * kv_heads * total * head`` of
the cache the attention reads in the same step. Whether the installed ONNX
Runtime rotates so is asked once (:func:`ort_kernels.gqa_rotates_by_position_ids`), not
assumed; the check stage compares every call site with torch afterwards, the left-padded
batch included.

What is left as it was, at DEBUG: a query or key that is no ``RotaryEmbedding`` output (partial
rotary concatenates the unrotated part back), two rotations that differ in positions, tables
or attributes, and an attention without ``query_seqlens`` (no generation step). The projection
is passed packed only where its ``Split``'s parts feed nothing else than the kernel, ``Shape``
read at batch and sequence (which the packed tensor has too) and ``CastLike``'s type input.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, TopologicalSortPass

from hyperexport.library.passes.fuse_layout import ATTENTION_KERNEL, ROTARY_KERNEL, swaps_heads
from hyperexport.library.passes.fuse_values import constant_array, static_dim
from hyperexport.library.passes.ir_build import insert_ints, insert_op
from hyperexport.library.passes.ort_kernels import (
    GQA_INPUTS,
    MS_DOMAIN,
    gqa_rotates_by_position_ids,
)
from hyperexport.library.tensor_slots import attribute_tensor

log = logging.getLogger(__name__)

_QUERY, _KEY, _VALUE = 0, 1, 2
_TOTAL = GQA_INPUTS.index("total_sequence_length")
_COS = GQA_INPUTS.index("cos_cache")
_SIN = GQA_INPUTS.index("sin_cache")
_POSITIONS = GQA_INPUTS.index("position_ids")
_QUERY_SEQLENS = GQA_INPUTS.index("query_seqlens")
#: RotaryEmbedding's attributes the kernel's own rotation has only at their defaults
#: (``interleaved`` it has either way: ``rotary_interleaved``).
_ROTARY_DEFAULTS = {"rotary_embedding_dim": 0, "is_packed_batching": 0}
#: The kernel rotates heads whose size is a multiple of this only (ONNX Runtime's CPU kernel).
_HEAD_MULTIPLE = 16
#: How deep two rotations' inputs are compared (fuse_rotary's tables are a few nodes deep).
_DEPTH = 12


def fold_rotary(owner: ir.Graph | ir.Function, attention: ir.Node) -> bool:
    """Fold the rotations of ``attention``'s query and key into it (module docstring); False
    where it does not apply, with the reason at DEBUG. The rotations are left unused (the
    pass removes them, then packs the projection: :func:`pack_projection`)."""
    inputs = list(attention.inputs)
    where = f"{owner.name}: {attention.name}"
    if len(inputs) <= _QUERY_SEQLENS or inputs[_QUERY_SEQLENS] is None:
        log.debug("rotary in attention: %s has no query_seqlens", where)
        return False
    if any(v is not None for v in inputs[_COS : _POSITIONS + 1]):
        log.debug("rotary in attention: %s rotates already", where)
        return False
    found = [_rotation(inputs[i], attention) for i in (_QUERY, _KEY)]
    if found[0] is None or found[1] is None:
        log.debug("rotary in attention: %s: its query or key is no rotation of its own", where)
        return False
    (query, query_source), (key, key_source) = found[0], found[1]
    if not (_same_attributes(query, key) and _default_attributes(query)):
        log.debug("rotary in attention: %s: its rotations' attributes differ", where)
        return False
    if not all(_same(a, b, _DEPTH) for a, b in zip(query.inputs[1:], key.inputs[1:], strict=True)):
        log.debug("rotary in attention: %s: its query and key are rotated differently", where)
        return False
    positions, cos, sin = query.inputs[1:4]
    assert positions is not None and cos is not None and sin is not None
    half = _table_width(cos)
    if half is None or (2 * half) % _HEAD_MULTIPLE:
        log.debug(
            "rotary in attention: %s: head size %s, not a multiple of %d",
            where,
            None if half is None else 2 * half,
            _HEAD_MULTIPLE,
        )
        return False
    total = inputs[_TOTAL]
    assert total is not None
    cos_cache, sin_cache = _padded_tables(owner, attention, cos, sin, total)
    for rotation in (query, key):
        _read_shapes_before(rotation)
    for slot, source, role in ((_QUERY, query_source, "query"), (_KEY, key_source, "key")):
        rotated = _input(attention, slot)
        unrotated = source.value(owner, attention, role)
        for usage in list(rotated.uses()):  # the attention, and shape or type readers
            usage.node.replace_input_with(usage.idx, unrotated)
    attention.replace_input_with(_COS, cos_cache)
    attention.replace_input_with(_SIN, sin_cache)
    attention.replace_input_with(_POSITIONS, positions)
    attention.attributes["do_rotary"] = ir.AttrInt64("do_rotary", 1)
    interleaved = query.attributes.get_int("interleaved", 0)
    attention.attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", interleaved)
    return True


@dataclass(frozen=True)
class _Unrotated:
    """What the attention takes in place of a rotation's output: the rotation's own input, or,
    for a rotation of heads first (``Reshape(Transpose(RotaryEmbedding(Transpose(x))))``, as
    after Qwen3's per-head norm), ``x`` (``(batch, seq, heads, head)``) reshaped as the output
    was."""

    source: ir.Value
    shape: ir.Value | None = None

    def value(self, owner: ir.Graph | ir.Function, before: ir.Node, role: str) -> ir.Value:
        if self.shape is None:
            return self.source
        return insert_op(
            owner, before, "Reshape", [self.source, self.shape], _named(before, f"{role}_heads")
        )


def _rotation(value: ir.Value | None, attention: ir.Node) -> tuple[ir.Node, _Unrotated] | None:
    """The ``com.microsoft.RotaryEmbedding`` that gives ``value`` (directly, or its heads
    swapped back and merged), with what the attention takes unrotated; None where anything
    but ``Shape`` or ``CastLike``'s type input reads ``value`` or the rotation besides the
    attention (a rotation keeps its input's shape and type: those read the unrotated value
    instead) or anything reads the steps between them."""
    if value is None or any(
        not _reads_shape_or_type(u.node, u.idx) for u in value.uses() if u.node is not attention
    ):
        return None
    node = value.producer()
    if node is None:
        return None
    if _is_rotation(node):
        return node, _Unrotated(_input(node, 0))
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    back = _only_use_producer(node.inputs[0])
    if not swaps_heads(back):
        return None
    assert back is not None
    rotation = back.inputs[0].producer() if back.inputs[0] is not None else None
    if rotation is None or not _is_rotation(rotation) or _other_readers(rotation, back):
        return None
    forth = _input(rotation, 0).producer()
    if not swaps_heads(forth):
        return None
    assert forth is not None
    return rotation, _Unrotated(_input(forth, 0), _input(node, 1))


def _other_readers(rotation: ir.Node, reader: ir.Node) -> bool:
    """Whether anything but ``reader`` and shape or type readers reads ``rotation``'s output."""
    return any(
        u.node is not reader and not _reads_shape_or_type(u.node, u.idx)
        for u in rotation.outputs[0].uses()
    )


def _read_shapes_before(rotation: ir.Node) -> None:
    """Point every shape or type reader of ``rotation``'s output at its input (the same shape
    and type)."""
    for usage in list(rotation.outputs[0].uses()):
        if _reads_shape_or_type(usage.node, usage.idx):
            usage.node.replace_input_with(usage.idx, _input(rotation, 0))


def _reads_shape_or_type(node: ir.Node, index: int) -> bool:
    """A ``Shape``, or ``CastLike``'s type input: what a rotation's input gives alike."""
    if node.domain not in ("", "ai.onnx"):
        return False
    return node.op_type == "Shape" or (node.op_type == "CastLike" and index == 1)


def _input(node: ir.Node, index: int) -> ir.Value:
    value = node.inputs[index]
    assert value is not None
    return value


def _only_use_producer(value: ir.Value | None) -> ir.Node | None:
    """``value``'s producer when ``value`` has exactly one use."""
    if value is None or len(value.uses()) != 1:
        return None
    return value.producer()


def _is_rotation(node: ir.Node) -> bool:
    return (
        node.domain == MS_DOMAIN
        and node.op_type == ROTARY_KERNEL
        and len(node.inputs) == 4
        and all(v is not None for v in node.inputs)
    )


def _table_width(table: ir.Value) -> int | None:
    """The rotation tables' width (half the head size): a static dim, or the constant width of
    the ``Reshape(..., [-1, width])`` fuse_rotary wrote."""
    width = static_dim(table, -1)
    if width is not None:
        return width
    node = table.producer()
    if node is None or node.op_type != "Reshape" or len(node.inputs) < 2:
        return None
    shape = constant_array(node.inputs[1])
    return int(shape[-1]) if shape is not None and shape.ndim == 1 and shape[-1] > 0 else None


def _default_attributes(node: ir.Node) -> bool:
    """Full-width, unpacked, unscaled rotation: what the attention kernel's rotation does."""
    if any(node.attributes.get_int(k, v) != v for k, v in _ROTARY_DEFAULTS.items()):
        return False
    return node.attributes.get_float("scale", 1.0) == 1.0


def _same_attributes(a: ir.Node, b: ir.Node) -> bool:
    if set(a.attributes) - {"num_heads"} != set(b.attributes) - {"num_heads"}:
        return False
    return all(
        _equal_attribute(a.attributes[k], b.attributes[k]) for k in a.attributes if k != "num_heads"
    )


def _equal_attribute(a: ir.Attr, b: ir.Attr) -> bool:
    if a.type != b.type:
        return False
    if a.type == ir.AttributeType.TENSOR:
        x, y = attribute_tensor(a), attribute_tensor(b)
        return x.dtype == y.dtype and np.array_equal(x, y)
    return bool(a.value == b.value)


def _same(a: ir.Value | None, b: ir.Value | None, depth: int) -> bool:
    """Whether ``a`` and ``b`` are the same value, or the same ops compute them from the same
    values (the rules wrote one table chain per rotation)."""
    if a is b:
        return True
    if a is None or b is None or depth == 0:
        return False
    x, y = a.producer(), b.producer()
    if x is None or y is None or a.index() != b.index():
        return False
    if (x.domain, x.op_type, x.overload) != (y.domain, y.op_type, y.overload):
        return False
    if len(x.inputs) != len(y.inputs) or set(x.attributes) != set(y.attributes):
        return False
    if not all(_equal_attribute(x.attributes[k], y.attributes[k]) for k in x.attributes):
        return False
    return all(_same(i, j, depth - 1) for i, j in zip(x.inputs, y.inputs, strict=True))


def _named(attention: ir.Node, role: str) -> str:
    """A node name unique in the attention's graph or function: the attention's name (or its
    output's), the pass's, the node's role."""
    stem = attention.name or attention.outputs[0].name or "attention"
    return f"{stem}_rotary_{role}"


def _padded_tables(
    owner: ir.Graph | ir.Function, before: ir.Node, cos: ir.Value, sin: ir.Value, total: ir.Value
) -> tuple[ir.Value, ir.Value]:
    """``cos`` and ``sin`` with zero rows after them up to ``total`` rows (the kernel's minimum)."""
    rows = insert_op(owner, before, "Shape", [cos], _named(before, "rows"), start=0, end=1)
    wanted = insert_op(
        owner, before, "Cast", [total], _named(before, "total"), to=int(ir.DataType.INT64)
    )
    zero = insert_ints(owner, before, [0], _named(before, "zero"))
    short = insert_op(owner, before, "Sub", [wanted, rows], _named(before, "short"))
    extra = insert_op(owner, before, "Max", [short, zero], _named(before, "extra"))
    pads = insert_op(
        owner, before, "Concat", [zero, zero, extra, zero], _named(before, "pads"), axis=0
    )
    return (
        insert_op(owner, before, "Pad", [cos, pads], _named(before, "cos_cache")),
        insert_op(owner, before, "Pad", [sin, pads], _named(before, "sin_cache")),
    )


def pack_projection(owner: ir.Graph | ir.Function, attention: ir.Node) -> None:
    """Pass ``Split(qkv)``'s three parts as ``qkv`` itself where nothing else needs them."""
    parts = attention.inputs[:3]
    split = parts[0].producer() if parts[0] is not None else None
    if split is None or split.op_type != "Split" or split.domain not in ("", "ai.onnx"):
        return
    if list(split.outputs) != list(parts) or split.attributes.get_int("axis", 0) not in (-1, 2):
        return
    packed = split.inputs[0]
    assert packed is not None
    others = [
        (u.node, u.idx)
        for part in parts
        if part is not None
        for u in part.uses()
        if u.node is not attention
    ]
    if not all(reads_batch_sequence_or_type(node, index) for node, index in others):
        return
    for node, index in others:
        node.replace_input_with(index, packed)
    attention.replace_input_with(_QUERY, packed)
    attention.replace_input_with(_KEY, None)
    attention.replace_input_with(_VALUE, None)
    owner.remove(split, safe=True)


def reads_batch_sequence_or_type(node: ir.Node, index: int) -> bool:
    """What the packed projection gives alike: ``CastLike``'s type input, or a ``Shape`` read
    at dims 0 and 1 only (by its start and end, or by every ``Gather`` of it)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "CastLike":
        return index == 1
    if node.op_type != "Shape":
        return False
    if "end" in node.attributes:
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", 0)
        return 0 <= start < end <= 2
    if node.attributes.get_int("start", 0) != 0:
        return False
    return all(_gathers_batch_or_sequence(u.node, u.idx) for u in node.outputs[0].uses())


def _gathers_batch_or_sequence(node: ir.Node, index: int) -> bool:
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or index != 0:
        return False
    at = constant_array(node.inputs[1])
    return at is not None and node.attributes.get_int("axis", 0) == 0 and set(at.ravel()) <= {0, 1}


class RotaryInAttentionPass(ir.passes.InPlacePass):
    """:func:`fold_rotary` on every ``GroupQueryAttention`` of the model and its functions."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        owners: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
        attentions = [
            (owner, node)
            for owner in owners
            for node in owner
            if node.domain == MS_DOMAIN and node.op_type == ATTENTION_KERNEL
        ]
        if not attentions:
            return ir.passes.PassResult(model, modified=False)
        # Nodes the earlier passes left unused may still read a Split's parts: gone first.
        cleaned = RemoveUnusedNodesPass()(model).modified
        if not gqa_rotates_by_position_ids():
            log.info(
                "rotary in attention: this ONNX Runtime's GroupQueryAttention does not rotate "
                "by position_ids; the rotations stay RotaryEmbedding kernels"
            )
            return ir.passes.PassResult(model, modified=cleaned)
        done = [(owner, node) for owner, node in attentions if fold_rotary(owner, node)]
        if done:  # the rotations (and their reshaping) go, then the projections pack
            RemoveUnusedNodesPass()(model)
            for owner, node in done:
                pack_projection(owner, node)
            # a Shape that read a rotation now reads what is made just before the attention
            TopologicalSortPass()(model)
        folded = len(done)
        if folded:
            log.info(
                "rotary in attention: %d of %d attentions rotate inside", folded, len(attentions)
            )
        return ir.passes.PassResult(model, modified=bool(folded) or cleaned)

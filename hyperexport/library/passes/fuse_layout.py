"""Head layout after the ``onnxruntime`` fusion: the moves between ``(batch, seq, heads * dim)``
and ``(batch, heads, seq, dim)`` that ONNX Runtime's kernels make unnecessary.

transformers splits each projection into heads and moves them forward (``Reshape``, then
``Transpose(0, 2, 1, 3)``) before RoPE and attention, and moves them back after. ONNX Runtime's
``RotaryEmbedding`` and ``GroupQueryAttention`` take and give the 3-D form, so the fusion rules
surround the kernels with the opposite moves (``fuse_attention._to_3d``/``_to_4d``). What is
left is a round trip per projection and step: two ``Transpose`` that ONNX Runtime cancels when
it loads the model, and two ``Reshape`` with the shape arithmetic behind them, which it keeps
(profiled: 490 kernels per decode step of an 8-layer Llama, 89 in the builder's model). Two
steps remove them:

* :func:`rotary_on_projections`: a rotation of split heads runs on the 3-D projection itself
  (the kernel reads the head size off its ``cos`` table);
* :func:`cancel_round_trips`: ``Reshape(Transpose(Transpose(Reshape(x))))`` that gives ``x``'s
  own shape back is ``x``.

Both act only where the inferred shapes prove the result the same (the batch and sequence
dimensions kept, the last one split and merged whole), and the check compares every call site
with torch afterwards.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from hyperexport.library.passes.fuse_values import annotated, ints, rank, static_dim

MS_DOMAIN = "com.microsoft"
ROTARY_KERNEL = "RotaryEmbedding"
ATTENTION_KERNEL = "GroupQueryAttention"

#: The permutation between ``(batch, seq, heads, dim)`` and ``(batch, heads, seq, dim)``.
_SWAP_HEADS = (0, 2, 1, 3)


def _owners(model: ir.Model) -> list[ir.Graph | ir.Function]:
    return [model.graph, *model.functions.values()]


def rotary_on_projections(model: ir.Model) -> int:
    """Run each ``com.microsoft.RotaryEmbedding`` of split heads on the 3-D projection.

    The remaining readers of the 4-D result may ask only for its type (``CastLike``) or for its
    batch and sequence sizes (``Gather`` of its ``Shape`` at 0 or 2), which the projection has
    at 0 and 1; a rotation with any other reader is left as it is. Returns how many moved.
    """
    moved = 0
    with annotated(model):
        for owner in _owners(model):
            for node in list(owner):
                if node.op_type == ROTARY_KERNEL and node.domain == MS_DOMAIN:
                    moved += _rotate_projection(owner, node)
    return moved


def _rotate_projection(owner: ir.Graph | ir.Function, rotary: ir.Node) -> int:
    projection = _split_projection(rotary.inputs[0], rotary.inputs[2])
    result = rotary.outputs[0]
    if projection is None or result in owner.outputs:
        return 0
    merges: list[ir.Value] = []  # Reshape outputs (batch, seq, -1) of the rotated heads
    sizes: list[tuple[ir.Node, int]] = []  # Gather of Shape(result), the projection's axis
    types: list[ir.Node] = []  # CastLike(x, result)
    for user, index in result.uses():
        merged = _merged(user)
        gathered = _gathered_axes(user) if is_op(user, "Shape") else None
        if merged is not None:
            merges.append(merged)
        elif gathered is not None:
            sizes.extend(gathered)
        elif is_op(user, "CastLike") and index == 1:
            types.append(user)
        else:
            return 0
    if not merges:
        return 0
    rotated = ir.Node(
        MS_DOMAIN,
        ROTARY_KERNEL,
        [projection, *rotary.inputs[1:]],
        attributes=[ir.Attr(a.name, a.type, a.value) for a in rotary.attributes.values()],
        name=f"{rotary.name}_3d" if rotary.name else None,
    )
    owner.insert_after(rotary, rotated)
    for merged in merges:
        ir.convenience.replace_all_uses_with(merged, rotated.outputs[0])
    for user in types:
        user.replace_input_with(1, projection)
    for gather, axis in sizes:
        read_axis(owner, gather, projection, axis)
    return 1


def read_axis(owner: ir.Graph | ir.Function, gather: ir.Node, source: ir.Value, axis: int) -> None:
    """Make ``gather`` (a ``Gather`` of one axis of some value's ``Shape``) read ``source``'s
    ``axis`` instead, as a scalar or a one-element vector as it did."""
    scalar = rank(gather.inputs[1]) == 0
    index = ir.tensor(np.asarray(axis if scalar else [axis], dtype=np.int64))
    constant = ir.node("Constant", [], attributes={"value": index})
    shape = ir.node("Shape", [source])
    owner.insert_before(gather, [constant, shape])
    gather.replace_input_with(0, shape.outputs[0])
    gather.replace_input_with(1, constant.outputs[0])


def _split_projection(heads: ir.Value | None, cos: ir.Value | None) -> ir.Value | None:
    """The 3-D projection ``x`` when ``heads`` is ``Transpose(Reshape(x, (b, s, n, d)))``
    (perm 0, 2, 1, 3), read by nothing else, with ``x`` of ``(b, s, n * d)`` and ``d`` twice the
    ``cos`` table's width; else None."""
    split = _split(heads)
    if split is None or len(heads.uses()) != 1:  # type: ignore[union-attr]
        return None
    x, four = split
    dim, half = static_dim(four, 3), static_dim(cos, 1)
    return x if dim is not None and half is not None and dim == 2 * half else None


def _split(heads: ir.Value | None) -> tuple[ir.Value, ir.Value] | None:
    """``(x, split)`` when ``heads`` is ``Transpose(split)`` (perm 0, 2, 1, 3), ``split =
    Reshape(x)`` read only by it, ``x`` 3-D and ``split`` its last dimension split into heads,
    the first two kept (``(0, 0, n, -1)`` by form, else by the inferred shapes); else None."""
    transpose = heads.producer() if heads is not None else None
    if not swaps_heads(transpose):
        return None
    four = transpose.inputs[0]  # type: ignore[union-attr]
    reshape = four.producer() if four is not None else None
    if not is_op(reshape, "Reshape") or four is None or len(four.uses()) != 1:
        return None
    x = reshape.inputs[0]  # type: ignore[union-attr]
    shape = shape_of(x)
    if x is None or shape is None or len(shape) != 3:
        return None
    target = ints(reshape.inputs[1])  # type: ignore[union-attr]
    if target is not None and len(target) == 4 and target[:2] == [0, 0] and -1 in target[2:]:
        return x, four
    if four.shape is None or rank(four) != 4:
        return None
    if not all(_same_dim(shape[axis], four.shape[axis]) for axis in (0, 1)):
        return None
    # The first two kept, so the last two hold the last one's elements: a split of it.
    dim, width = static_dim(four, 3), shape[2]
    if dim is None or not isinstance(width, int) or width % dim:
        return None
    return x, four


def shape_of(x: ir.Value | None) -> ir.Shape | None:
    """``x``'s shape: inferred, or for the rotary and attention kernels' first output (which
    ONNX's shape inference, not knowing them, leaves unknown) their first input's."""
    if x is None:
        return None
    if x.shape is not None:
        return x.shape
    node = x.producer()
    kernels = (ROTARY_KERNEL, ATTENTION_KERNEL)
    keeps = node is not None and node.op_type in kernels and node.domain == MS_DOMAIN
    if keeps and x is node.outputs[0] and node.inputs[0] is not None:  # type: ignore[union-attr]
        return shape_of(node.inputs[0])  # type: ignore[union-attr]
    return None


def _merged(user: ir.Node, x: ir.Value | None = None) -> ir.Value | None:
    """The output of ``Reshape(user, target)`` when ``user`` is ``Transpose`` (perm 0, 2, 1, 3)
    read only by that Reshape and the target merges the heads back: ``(0, 0, -1)``, or, given
    the split ``x``, any target whose inferred result has ``x``'s shape; else None."""
    if not swaps_heads(user):
        return None
    uses = list(user.outputs[0].uses())
    if len(uses) != 1:
        return None
    reshape = uses[0][0]
    if not is_op(reshape, "Reshape"):
        return None
    merged = reshape.outputs[0]
    if ints(reshape.inputs[1]) == [0, 0, -1]:
        return merged
    shape = shape_of(x)
    if shape is None or len(shape) != 3:
        return None
    # Each dimension proved by the inferred shape or by the target's own computation.
    known: list[list[object]] = []
    if merged.shape is not None and rank(merged) == 3:
        known.append(list(merged.shape))
    target = _target_dims(reshape.inputs[1])
    if target is not None and len(target) == 3:
        if target[2] == -1:  # the rest: x's last dimension once the first two are x's
            target[2] = shape[2] if all(_same_dim(shape[i], target[i]) for i in (0, 1)) else None
        known.append(target)
    proved = all(any(_same_dim(shape[i], dims[i]) for dims in known) for i in range(3))
    return merged if known and proved else None


def _target_dims(target: ir.Value | None) -> list[object] | None:
    """A shape computed as ``Concat`` of one-element values, each a constant or ``Gather`` of a
    value's ``Shape`` at a constant axis (the TorchScript path's ``x.view(*x.shape[:2], -1)``):
    its dimensions, symbolic where the value's are; else None."""
    concat = target.producer() if target is not None else None
    if not is_op(concat, "Concat"):
        return None
    dims: list[object] = []
    for item in concat.inputs:  # type: ignore[union-attr]
        node = item.producer() if item is not None else None
        if is_op(node, "Unsqueeze"):
            item = node.inputs[0]  # type: ignore[union-attr]
            node = item.producer() if item is not None else None
        constant = ints(item)
        if constant is not None and len(constant) == 1:
            dims.append(constant[0])
            continue
        shape = node.inputs[0].producer() if is_op(node, "Gather") and node.inputs[0] else None  # type: ignore[union-attr]
        axis = ints(node.inputs[1]) if shape is not None else None  # type: ignore[union-attr]
        source = shape_of(shape.inputs[0]) if is_op(shape, "Shape") else None  # type: ignore[union-attr]
        if (
            source is None
            or axis is None
            or len(axis) != 1
            or not -len(source) <= axis[0] < len(source)
        ):
            return None
        dims.append(source[axis[0]])
    return dims


def _gathered_axes(shape: ir.Node) -> list[tuple[ir.Node, int]] | None:
    """For ``Shape(result)`` read only by ``Gather`` of axis 0 or 2: each Gather and the 3-D
    projection's axis it stands for (0 or 1); else None."""
    if shape.attributes.get("start") is not None or shape.attributes.get("end") is not None:
        return None
    found = []
    for gather, index in shape.outputs[0].uses():
        axis = ints(gather.inputs[1]) if is_op(gather, "Gather") and index == 0 else None
        if axis is None or len(axis) != 1 or axis[0] not in (0, 2):
            return None
        if gather.attributes.get_int("axis", 0) != 0:
            return None
        found.append((gather, axis[0] // 2))
    return found


def cancel_round_trips(model: ir.Model) -> int:
    """Replace ``Reshape(Transpose(Transpose(Reshape(x))))`` by ``x`` where it gives ``x``'s
    shape back: heads split off ``x``'s last dimension (:func:`_split`), moved forward and back
    (perm 0, 2, 1, 3 twice), and merged with ``(0, 0, -1)``. Returns how many went."""
    cancelled = 0
    with annotated(model):
        for owner in _owners(model):
            for node in list(owner):
                if not swaps_heads(node):
                    continue
                split = _split(node.inputs[0])
                merged = _merged(node, split[0]) if split is not None else None
                if merged is None or split is None or merged in owner.outputs:
                    continue
                if len(node.inputs[0].uses()) != 1:  # type: ignore[union-attr]
                    continue
                ir.convenience.replace_all_uses_with(merged, split[0])
                cancelled += 1
    return cancelled


def is_op(node: ir.Node | None, op_type: str) -> bool:
    """Whether ``node`` is a default-domain ``op_type``."""
    return node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx")


def swaps_heads(node: ir.Node | None) -> bool:
    """Whether ``node`` is a ``Transpose`` between ``(batch, seq, heads, dim)`` and
    ``(batch, heads, seq, dim)``."""
    return is_op(node, "Transpose") and _perm(node) == _SWAP_HEADS  # type: ignore[arg-type]


def _perm(transpose: ir.Node) -> tuple[int, ...] | None:
    attribute = transpose.attributes.get("perm")
    return tuple(attribute.as_ints()) if attribute is not None else None


def _same_dim(a: object, b: object) -> bool:
    """Two dimensions known to be equal: the same int, or the same named symbol."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    named = a is not None and b is not None and getattr(a, "value", None) is not None
    return named and str(a) == str(b)

"""``hyperexport.attention::Attention`` as ONNX Runtime's attention kernels (``com.microsoft``).

The custom node (``transformers/attention_onnx.py``) takes 4-D ``(batch, heads, seq, head_dim)``
queries, keys and values and an optional mask, and gives ``(batch, q_heads, seq, v_dim)``. It
becomes:

* ``GroupQueryAttention`` when the call is causal: ``is_causal=1``, or ``causal_hint=1`` (the
  module is a decoder's self-attention and its mask, if any, already hides later keys).
  GroupQueryAttention aligns its causal mask bottom-right, ONNX's ``is_causal`` upper-left, so
  either the query and key lengths are known equal (the keys are the whole sequence: every
  ``seqlens_k`` entry is the key length less one), or the keys and values are
  ``Concat(past, new)`` and the call has the hint (a generation step: the past goes to
  ``past_key``/``past_value``, the kernel's presents replace the concatenations,
  :class:`CachedAttentionRule`). The mask, if any, is added to the scores (``attention_bias``:
  ``False`` -> the type's lowest finite value, so a row whose keys are all masked stays finite),
  which together with the kernel's own causal mask is exactly the mask (padding, sliding
  windows).
* ``MultiHeadAttention`` when it is not causal and queries and keys have as many heads (an
  encoder's attention), its mask added the same way.

Both kernels take 3-D ``(batch, seq, heads * head_dim)`` tensors: the node's inputs are
transposed and reshaped into them, and the output back, so the function's other nodes and its
inputs and outputs stay as they were (the transposes the exporter wrote around the node then
cancel; ONNX Runtime removes such pairs when it loads the model). What cannot be fused faithfully
(softcap without GroupQueryAttention, grouped heads without causality, unknown head counts) is a
:class:`AttentionRefusal` naming the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from hyperexport.base.contracts.names import ATTENTION_ATTRIBUTES, ATTENTION_DOMAIN
from hyperexport.library.passes.fuse_values import constant_array, rank, static_dim
from hyperexport.library.passes.ort_kernels import gqa_takes_query_seqlens

MS_DOMAIN = "com.microsoft"
_ATTRIBUTES = frozenset(ATTENTION_ATTRIBUTES)
#: The most negative finite value of each float type, as a float32 that CastLike keeps finite.
_LOWEST = {
    ir.DataType.FLOAT: float(np.finfo(np.float32).min),
    ir.DataType.FLOAT16: float(np.finfo(np.float16).min),
    ir.DataType.BFLOAT16: -3.3895313892515355e38,
}


@dataclass(frozen=True)
class AttentionPlan:
    """How one attention node becomes a kernel.

    Attributes:
        kernel: ``GroupQueryAttention`` or ``MultiHeadAttention``.
        q_heads: Query heads. kv_heads: Key/value heads.
        scale: Factor on the scores. softcap: Cap on the scores (0: none).
        lowest: The additive value of a masked-out key (a boolean mask), or None.
    """

    kernel: str
    q_heads: int
    kv_heads: int
    scale: float
    softcap: float
    lowest: float | None


class AttentionRefusal(ValueError):
    """The node cannot become an ONNX Runtime kernel; the message says why."""


def is_attention(node: ir.Node) -> bool:
    return node.domain == ATTENTION_DOMAIN and node.op_type == "Attention"


def attention_plan(node: ir.Node, cached: bool = False) -> AttentionPlan:
    """The kernel for ``node``, or :class:`AttentionRefusal`. ``cached``: its keys and values
    are ``Concat(past, new)`` on the sequence axis, which GroupQueryAttention takes apart."""
    inputs = list(node.inputs)
    if len(inputs) not in (3, 4) or any(v is None for v in inputs[:3]):
        raise AttentionRefusal(f"expected inputs Q, K, V[, attn_mask], got {len(inputs)}")
    unknown = set(node.attributes) - _ATTRIBUTES
    if unknown:
        raise AttentionRefusal(f"unknown attributes {sorted(unknown)}")
    if node.attributes.get_int("q_num_heads", 0):
        raise AttentionRefusal("3-D inputs (q_num_heads set) are not fused; 4-D inputs are")
    q, k = inputs[0], inputs[1]
    assert q is not None and k is not None
    if 3 in (rank(q), rank(k)):
        raise AttentionRefusal("3-D inputs are not fused; 4-D inputs are")
    q_heads, kv_heads = _heads(q), _heads(k)
    if q_heads is None or kv_heads is None:
        raise AttentionRefusal("the head counts are unknown (Q and K have no static dim 1)")
    mask = inputs[3] if len(inputs) == 4 else None
    lowest = _mask_value(mask, q)
    softcap = node.attributes.get_float("softcap", 0.0)
    scale = node.attributes.get_float("scale", 0.0) or 1.0 / float(np.sqrt(_head_dim(q)))
    if _causal(node, q, k, cached):
        return AttentionPlan("GroupQueryAttention", q_heads, kv_heads, scale, softcap, lowest)
    if q_heads != kv_heads:
        raise AttentionRefusal(
            f"{q_heads} query heads on {kv_heads} key heads without causality: ONNX Runtime's "
            "MultiHeadAttention needs equal head counts"
        )
    if softcap:
        raise AttentionRefusal("softcap without causality: MultiHeadAttention has no softcap")
    return AttentionPlan("MultiHeadAttention", q_heads, kv_heads, scale, 0.0, lowest)


#: Ops whose output has dim 1 of their inputs, broadcast (elementwise) or passed through.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Cast", "Identity", "Where"})
_FIRST_INPUT = frozenset({"RotaryEmbedding", "Slice"})


def _heads(x: ir.Value | None, depth: int = 0) -> int | None:
    """Dim 1 (heads) of a 4-D ``(batch, heads, seq, dim)`` value: from its shape, or, where
    shape inference left it unknown (dynamic axes meet transformers' ``view(..., -1, head_dim)``),
    from the ops that made it: ``Transpose(Reshape((B, S, W), (B, S, -1, D)))`` has ``W // D``
    (a per-head norm between them, Qwen3's, and ``W`` a constant slice of a packed projection,
    Phi-3's, included); RoPE, slices and elementwise ops (broadcast: the largest) and a
    concatenation along the sequence or the head size (a partial rotary's) keep their inputs'."""
    if x is None or depth > 12:
        return None
    heads = static_dim(x, 1)
    node = x.producer()
    if heads is not None or node is None:
        return heads
    if node.op_type in _FIRST_INPUT:
        return _heads(node.inputs[0], depth + 1)
    if node.op_type == "Concat" and node.attributes.get_int("axis", 0) in (2, -2, 3, -1):
        found = [_heads(v, depth + 1) for v in node.inputs]
        return next((h for h in found if h is not None), None)
    if node.op_type in _ELEMENTWISE and node.domain in ("", "ai.onnx"):
        return _broadcast(
            [_heads(v, depth + 1) for v in node.inputs if v is not None and rank(v) in (4, None)]
        )
    if node.op_type == "Transpose":
        return _split_heads(node)
    return None


def _broadcast(found: list[int | None]) -> int | None:
    """The head count of an elementwise op's output from its inputs' (None: unknown): every
    input has it or 1, so the largest known one, when one above 1 is known or all are."""
    known = [h for h in found if h is not None]
    if known and (max(known) > 1 or len(known) == len(found)):
        return max(known)
    return None


def _split_heads(transpose: ir.Node) -> int | None:
    """``W // D`` of ``Transpose(Reshape((B, S, W), (B, S, -1, D)), perm=[0, 2, 1, 3])``, with
    elementwise ops and last-axis reductions (a per-head norm) between the two."""
    perm = transpose.attributes.get("perm")
    if perm is None or list(perm.as_ints()) != [0, 2, 1, 3]:
        return None
    return _heads_at_2(transpose.inputs[0])


def _heads_at_2(split: ir.Value | None, depth: int = 0) -> int | None:
    """Dim 2 (heads) of a 4-D ``(batch, seq, heads, dim)`` value, before the heads' transpose."""
    if split is None or depth > 12:
        return None
    heads = static_dim(split, 2)
    node = split.producer()
    if heads is not None or node is None or node.domain not in ("", "ai.onnx"):
        return heads
    if node.op_type in _ELEMENTWISE | _NORM_STEPS or _reduces_last_axis(node):
        read = node.inputs[: 1 if node.op_type.startswith("Reduce") else None]
        return _broadcast(
            [_heads_at_2(v, depth + 1) for v in read if v is not None and rank(v) in (4, None)]
        )
    if node.op_type != "Reshape" or split.shape is None or rank(split) != 4:
        return None
    joined = node.inputs[0]
    kept, width = _rows_and_width(joined)
    head = static_dim(split, 3)
    if kept is None or not width or not head or width % head:
        return None
    if kept != list(split.shape)[:2] or not all(_named(d) for d in kept):
        return None
    return width // head


#: Ops of a per-head RMS norm besides the elementwise ones (the reduction is checked apart).
_NORM_STEPS = frozenset({"Pow", "Sqrt", "Reciprocal"})


def _reduces_last_axis(node: ir.Node) -> bool:
    """A ``ReduceMean``/``ReduceSum`` over the last axis of a 4-D value, keeping it."""
    if node.op_type not in ("ReduceMean", "ReduceSum") or not node.attributes.get_int(
        "keepdims", 1
    ):
        return False
    attribute = node.attributes.get("axes")
    if attribute is not None:
        axes = list(attribute.as_ints())
    else:
        found = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
        axes = [] if found is None else [int(a) for a in np.ravel(found)]
    return axes in ([-1], [3])


def _rows_and_width(joined: ir.Value | None) -> tuple[list[int | ir.SymbolicDim] | None, int]:
    """The first two dims and the last (``W``) of the 3-D value the heads are split from; a
    slice of the last axis by constants (one part of a packed projection) has the sliced
    value's first two dims and the slice's width."""
    if joined is None or joined.shape is None or rank(joined) != 3:
        return None, 0
    width = static_dim(joined, -1)
    if width:
        return list(joined.shape)[:2], width
    node = joined.producer()
    if node is None or node.op_type != "Slice" or node.domain not in ("", "ai.onnx"):
        return None, 0
    data = node.inputs[0]
    size = static_dim(data, -1)
    parts = [constant_array(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = parts[0], parts[1]
    axes = parts[2] if len(parts) > 2 and parts[2] is not None else np.array([-1])
    steps = parts[3] if len(parts) > 3 and parts[3] is not None else np.array([1])
    if data is None or data.shape is None or rank(data) != 3 or not size:
        return None, 0
    if starts is None or ends is None or [int(a) for a in np.ravel(axes)] not in ([-1], [2]):
        return None, 0
    picked = range(size)[
        int(np.ravel(starts)[0]) : int(np.ravel(ends)[0]) : int(np.ravel(steps)[0])
    ]
    return list(data.shape)[:2], len(picked)


def _named(dim: int | ir.SymbolicDim) -> bool:
    """A dim known to be the same wherever it appears: an int or a named symbol."""
    return isinstance(dim, int) or dim.value is not None


def _head_dim(q: ir.Value) -> int:
    head = static_dim(q, -1)
    if head is None:
        raise AttentionRefusal("no scale attribute and the head size is unknown")
    return head


def _causal(node: ir.Node, q: ir.Value, k: ir.Value, cached: bool) -> bool:
    """Whether GroupQueryAttention computes the node: a causal call whose keys are the
    queries' own (equal lengths), or past and new keys with the hint (bottom-right causal)."""
    hint = bool(node.attributes.get_int("causal_hint", 0))
    if cached:
        if not hint:
            raise AttentionRefusal("keys from a cache without causal_hint (not a decoder's)")
        return True
    if not hint and not node.attributes.get_int("is_causal", 0):
        return False
    q_len, k_len = _length(q), _length(k)
    if q_len is None or q_len != k_len:
        raise AttentionRefusal(
            "a causal call whose query and key lengths are not known equal and whose keys are "
            "not Concat(past, new): GroupQueryAttention would misplace its causal mask"
        )
    return True


def _length(x: ir.Value) -> int | str | None:
    """The sequence dim (2) of a 4-D value: an int, a dim name, or None when unknown."""
    if x.shape is None or x.shape.rank() != 4:
        return None
    dim = x.shape[2]
    return dim if isinstance(dim, int) else dim.value


def _mask_value(mask: ir.Value | None, q: ir.Value) -> float | None:
    if mask is None:
        return None
    if rank(mask) != 4:
        raise AttentionRefusal(f"the mask has rank {rank(mask)}, not 4")
    if mask.dtype == ir.DataType.BOOL:
        if q.dtype not in _LOWEST:
            raise AttentionRefusal(f"a boolean mask on queries of type {q.dtype}")
        return _LOWEST[q.dtype]
    if mask.dtype is None or mask.dtype != q.dtype:
        raise AttentionRefusal(f"the mask's type {mask.dtype} is neither bool nor Q's {q.dtype}")
    return None


class AttentionKernelRule(pattern.RewriteRuleClassBase):
    """The custom attention node -> GroupQueryAttention or MultiHeadAttention, 3-D adapters
    around it."""

    def __init__(self, masked: bool) -> None:
        super().__init__(f"AttentionKernel{'Masked' if masked else ''}")
        self._masked = masked

    def pattern(self, op, q, k, v, mask):  # type: ignore[no-untyped-def]
        inputs = [q, k, v, mask] if self._masked else [q, k, v]
        return op.Attention(*inputs, _domain=ATTENTION_DOMAIN, _outputs=["out"])

    def check(self, op, out, **_):  # type: ignore[no-untyped-def]
        try:
            self._plan = attention_plan(out.producer())
        except AttentionRefusal as e:
            return pattern.MatchResult().fail(str(e), out)
        return pattern.MatchResult()

    def rewrite(self, op, q, k, v, mask=None, **_):  # type: ignore[no-untyped-def]
        plan = self._plan
        k3, v3 = _to_3d(op, k), _to_3d(op, v)
        if plan.kernel == "MultiHeadAttention":
            q3, bias = _to_3d(op, q), _bias(op, plan, q, mask)
            inputs = [q3, k3, v3] if bias is None else [q3, k3, v3, None, None, bias]
            out3 = op.MultiHeadAttention(
                *inputs, num_heads=plan.q_heads, scale=plan.scale, _domain=MS_DOMAIN
            )
            return _to_4d(op, out3, plan.q_heads)
        total = op.Gather(op.Shape(k), op.Constant(value_int=2))
        out3, _, _ = _group_query_attention(op, plan, q, k3, v3, None, None, total, mask)
        return _to_4d(op, out3, plan.q_heads)


def _bias(op, plan: AttentionPlan, q, mask):  # type: ignore[no-untyped-def]
    """The mask as ``attention_bias``: a boolean one as 0 / the lowest finite value."""
    if mask is None or plan.lowest is None:
        return mask
    zero, lowest = op.Constant(value_float=0.0), op.Constant(value_float=plan.lowest)
    if q.dtype != ir.DataType.FLOAT:  # float32 needs no cast (ONNX Runtime would drop it at load)
        zero, lowest = op.CastLike(zero, q), op.CastLike(lowest, q)
    return op.Where(mask, zero, lowest)


def _group_query_attention(op, plan, q, k3, v3, past_k, past_v, total, mask, rows=None):  # type: ignore[no-untyped-def]
    """``(output, present_key, present_value)``: every batch entry ``total`` keys long
    (``seqlens_k = total - 1``; padding is in the mask, added as ``attention_bias``); ``rows``:
    ``query_seqlens``, the new tokens of each entry."""
    seqlens = op.Expand(
        op.Sub(op.Reshape(total, op.Constant(value_ints=[1])), op.Constant(value_ints=[1])),
        op.Gather(op.Shape(q), op.Constant(value_ints=[0])),
    )
    inputs = [
        _to_3d(op, q), k3, v3, past_k, past_v,
        op.Cast(seqlens, to=int(ir.DataType.INT32)),
        op.Cast(total, to=int(ir.DataType.INT32)),
    ]  # fmt: skip
    bias = _bias(op, plan, q, mask)
    if bias is not None or rows is not None:  # after cos_cache, sin_cache, position_ids
        inputs += [None, None, None, bias]
    if rows is not None:  # after head_sink, k_scale, v_scale, q_norm_weight, k_norm_weight
        inputs += [None, None, None, None, None, rows]
    attributes: dict[str, object] = {
        "num_heads": plan.q_heads,
        "kv_num_heads": plan.kv_heads,
        "scale": plan.scale,
    }
    if plan.softcap:
        attributes["softcap"] = plan.softcap
    return op.GroupQueryAttention(*inputs, **attributes, _domain=MS_DOMAIN, _outputs=3)


def _to_3d(op, x):  # type: ignore[no-untyped-def]
    """``(batch, heads, seq, dim)`` -> ``(batch, seq, heads * dim)``."""
    return op.Reshape(op.Transpose(x, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))


def _to_4d(op, x, heads: int):  # type: ignore[no-untyped-def]
    """``(batch, seq, heads * dim)`` -> ``(batch, heads, seq, dim)``."""
    return op.Transpose(op.Reshape(x, op.Constant(value_ints=[0, 0, heads, -1])), perm=[0, 2, 1, 3])


#: Why attention over a cache has no kernel in an ONNX Runtime without ``query_seqlens``.
NO_QUERY_SEQLENS = (
    "keys from a cache: this ONNX Runtime's GroupQueryAttention takes no query_seqlens, without "
    "which it runs several new tokens over a past for batch 1 only"
)


def cache_refusal(node: ir.Node) -> str | None:
    """:data:`NO_QUERY_SEQLENS` when ``node`` attends over ``Concat(past, new)`` keys and values
    and the installed ONNX Runtime's GroupQueryAttention takes no ``query_seqlens`` (what
    :class:`CachedAttentionRule` refuses, which the uncached rules then refuse for another
    reason); None otherwise."""
    if gqa_takes_query_seqlens() or len(node.inputs) < 3:
        return None
    for value in node.inputs[1:3]:
        producer = value.producer() if value is not None else None
        if (
            producer is None
            or producer.op_type != "Concat"
            or producer.domain not in ("", "ai.onnx")
        ):
            return None
    return NO_QUERY_SEQLENS


class CachedAttentionRule(pattern.RewriteRuleClassBase):
    """Attention over ``Concat(past, new)`` keys and values (a decoder layer's step with its KV
    cache, ``transformers/kv_layers.py``) -> GroupQueryAttention taking the past as
    ``past_key``/``past_value``; its ``present_key``/``present_value`` (past and new) replace the
    concatenations wherever they were used (the step's present outputs). In onnxruntime-genai's
    generation step the pasts then become shared buffers (``share_kv_buffer.py``, the next
    entry of the pass list), which this rule's form already is for a past of exact length."""

    def __init__(self, masked: bool) -> None:
        super().__init__(f"CachedAttentionKernel{'Masked' if masked else ''}")
        self._masked = masked

    def pattern(self, op, q, past_k, new_k, past_v, new_v, mask):  # type: ignore[no-untyped-def]
        k = op.Concat(past_k, new_k, _outputs=["k"])
        v = op.Concat(past_v, new_v, _outputs=["v"])
        inputs = [q, k, v, mask] if self._masked else [q, k, v]
        out = op.Attention(*inputs, _domain=ATTENTION_DOMAIN, _outputs=["out"])
        return out, k, v

    def check(self, op, out, k, v, **_):  # type: ignore[no-untyped-def]
        if not gqa_takes_query_seqlens():
            return pattern.MatchResult().fail(NO_QUERY_SEQLENS, out)
        for value in (k, v):
            axis = value.producer().attributes.get_int("axis", 0)
            if axis not in (2, -2):
                return pattern.MatchResult().fail(f"keys/values concatenated on axis {axis}", value)
        try:
            self._plan = attention_plan(out.producer(), cached=True)
        except AttentionRefusal as e:
            return pattern.MatchResult().fail(str(e), out)
        return pattern.MatchResult()

    def rewrite(self, op, q, past_k, new_k, past_v, new_v, mask=None, **_):  # type: ignore[no-untyped-def]
        plan = self._plan
        total = op.Add(
            op.Gather(op.Shape(past_k), op.Constant(value_int=2)),
            op.Gather(op.Shape(new_k), op.Constant(value_int=2)),
        )
        # Every row of the new tokens is valid (padding is in the mask).
        rows = op.Cast(
            op.Expand(
                op.Gather(op.Shape(new_k), op.Constant(value_ints=[2])),
                op.Gather(op.Shape(q), op.Constant(value_ints=[0])),
            ),
            to=int(ir.DataType.INT32),
        )
        out3, present_k, present_v = _group_query_attention(
            op, plan, q, _to_3d(op, new_k), _to_3d(op, new_v), past_k, past_v, total, mask, rows
        )
        return _to_4d(op, out3, plan.q_heads), present_k, present_v


def rules() -> list[pattern.RewriteRule]:
    """The cached form first: its attention node would match the plain rule too."""
    return [
        *(CachedAttentionRule.rule(masked) for masked in (True, False)),
        *(AttentionKernelRule.rule(masked) for masked in (True, False)),
    ]

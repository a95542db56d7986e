"""Fusion rules for rotary position embeddings (transformers' ``rotate_half`` form).

transformers applies RoPE to 4-D ``(batch, heads, seq, head_dim)`` queries and keys as
``x * cos + rotate_half(x) * sin``, with ``cos``/``sin`` of shape ``(batch, seq, head_dim)``
unsqueezed at axis 1, and ``rotate_half(x) = cat(-x[..., h:], x[..., :h])``, ``h = head_dim/2``.
Its ``cos``/``sin`` repeat their first half (``cat(freqs, freqs)``), which is what makes that a
rotation of the pairs ``(x[i], x[i + h])``; the fused kernels read the first half only. A model
whose tables do not repeat would not compute RoPE at all; the check compares every call site
with torch, so such a model fails there, not silently.

Inside a layer function ``cos`` and ``sin`` are per-token inputs (the root computes them from the
positions), not a table indexed by position, so:

* ``standard``: ONNX ``RotaryEmbedding`` (opset 23) takes them as 3-D caches
  ``(batch, seq, h)`` without ``position_ids``;
* ``onnxruntime``: ``com.microsoft.RotaryEmbedding`` wants a 2-D table and ``position_ids``:
  the per-token rows become the table (``batch * seq`` rows) and ``position_ids`` number them
  ``0 .. batch * seq - 1``, so each token reads its own row.
"""

from __future__ import annotations

from onnxscript.rewriter import pattern

from hyperexport.base.contracts.names import STANDARD_FUSION
from hyperexport.library.passes.fuse_values import ints, rank, static_dim

MS_DOMAIN = "com.microsoft"
_TO_END = 2**63 - 1


class RotaryEmbeddingRule(pattern.RewriteRuleClassBase):
    """``x * cos + rotate_half(x) * sin`` -> one RotaryEmbedding node (``remove_nodes=False``:
    queries and keys share the unsqueezed ``cos``/``sin``; unused nodes go afterwards)."""

    def __init__(self, target: str) -> None:
        super().__init__(f"RotaryEmbedding_{target}", remove_nodes=False)
        self._target = target

    def pattern(
        self, op, x, cos, sin, cos_axes, sin_axes, start1, end1, axes1, start2, end2, axes2
    ):  # type: ignore[no-untyped-def]
        first = op.Slice(x, start1, end1, axes1, _allow_other_inputs=True, _outputs=["first"])
        second = op.Slice(x, start2, end2, axes2, _allow_other_inputs=True, _outputs=["second"])
        rotated = op.Concat(op.Neg(second), first, _outputs=["rotated"])
        cos4 = op.Unsqueeze(cos, cos_axes, _outputs=["cos4"])
        sin4 = op.Unsqueeze(sin, sin_axes)
        return op.Add(op.Mul(x, cos4), op.Mul(rotated, sin4))

    def check(self, op, x, cos, cos4, cos_axes, sin_axes, first, second, rotated, **_):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        if ints(cos_axes) != [1] or ints(sin_axes) != [1]:
            return result.fail("cos/sin are not unsqueezed at axis 1", cos_axes)
        if 4 not in (rank(x), rank(cos4)) and rank(cos) != 3:
            return result.fail("the rotated input is not known to be 4-D", x)
        head = static_dim(x, -1)
        if head is None or head % 2:
            return result.fail(f"the head size {head} is unknown or odd", x)
        half = head // 2
        if not (_slice(first, 0, half) and _slice(second, half, head)):
            return result.fail(f"the halves are not [:{half}] and [{half}:] of the last axis", x)
        axis = rotated.producer().attributes.get_int("axis", 0)
        if axis not in (-1, 3):
            return result.fail(f"the halves are concatenated on axis {axis}", rotated)
        self._half = half
        return result

    def rewrite(self, op, x, cos, sin, **_):  # type: ignore[no-untyped-def]
        cos_half = _first_half(op, cos, self._half)
        sin_half = _first_half(op, sin, self._half)
        if self._target == STANDARD_FUSION:
            return op.RotaryEmbedding(x, cos_half, sin_half, interleaved=0)
        shape = op.Shape(cos_half)
        rows = op.Mul(
            op.Gather(shape, op.Constant(value_int=0)), op.Gather(shape, op.Constant(value_int=1))
        )
        positions = op.Reshape(
            op.Range(op.Constant(value_int=0), rows, op.Constant(value_int=1)),
            op.Slice(shape, op.Constant(value_ints=[0]), op.Constant(value_ints=[2])),
        )
        width = op.Constant(value_ints=[-1, self._half])
        return op.RotaryEmbedding(
            x,
            positions,
            op.Reshape(cos_half, width),
            op.Reshape(sin_half, width),
            interleaved=0,
            _domain=MS_DOMAIN,
        )


def _first_half(op, table, half: int):  # type: ignore[no-untyped-def]
    return op.Slice(
        table,
        op.Constant(value_ints=[0]),
        op.Constant(value_ints=[half]),
        op.Constant(value_ints=[-1]),
    )


def _slice(value, start: int, end: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``value`` is ``x[..., start:end]`` (an end past the axis counts as ``end``)."""
    node = value.producer()
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends, axes, steps = (ints(v) if v is not None else None for v in inputs[1:5])
    if starts != [start] or axes not in ([-1], [3]) or steps not in (None, [1]):
        return False
    return (
        ends is not None
        and len(ends) == 1
        and (ends[0] == end or ends[0] >= max(end, _TO_END // 2))
    )


def rules(target: str) -> list[pattern.RewriteRule]:
    """The RoPE rule for ``standard`` or ``onnxruntime``, in every operand order of its sum and
    products (all three have two computed operands)."""
    return list(RotaryEmbeddingRule.rule(target).commute())

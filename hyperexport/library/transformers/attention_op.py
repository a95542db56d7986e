"""The ``hyperexport::attention`` custom op and its eager reference implementation.

The op is the export-time stand-in for one attention call. Its semantics follow ONNX
``Attention`` (opset 24) restricted to what ``torch.nn.functional.scaled_dot_product_attention``
also computes, so that the promoted ONNX model and the eager model agree:

* 4-D inputs ``(batch, heads, seq, head_dim)``; or 3-D inputs ``(batch, seq, heads * head_dim)``
  with ``q_num_heads``/``kv_num_heads`` given (``0`` means "4-D").
* GQA by head broadcast: query head ``h`` reads key/value head ``h // (q_heads // kv_heads)``.
* ``attn_mask``: boolean (``True`` takes part) or additive float, broadcast to the scores.
* ``is_causal``: upper-left aligned lower triangle (the same as SDPA and, without a KV cache
  input, ONNX ``Attention``).
* ``softcap > 0``: ``softcap * tanh(scores / softcap)`` after scaling, before the mask.
* A query row whose keys are all masked out gives zeros (as SDPA and ONNX do), not NaN.
* ``causal_hint`` changes nothing computed: it records that the call is causal self-attention
  whose mask (if any) already hides every later key, the query's last row aligned with the last
  key (a decoder's attention, ``module.is_causal``). ONNX Runtime's ``GroupQueryAttention``,
  always causal, may then stand for the call (``passes/fuse_attention.py``).

The op is defined in torch's dispatcher on first use (:func:`attention_op`), never on import.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from hyperexport.base.versions import torch_library_has_custom_op

OP_NAMESPACE = "hyperexport"
OP_NAME = "attention"
QUALIFIED_NAME = f"{OP_NAMESPACE}::{OP_NAME}"

# Keeps the op's library alive: dropping it would undefine the op.
_LIBRARIES: list[torch.library.Library] = []


def _to_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(batch, seq, heads * dim) -> (batch, heads, seq, dim)."""
    batch, seq, width = x.shape
    return x.reshape(batch, seq, num_heads, width // num_heads).transpose(1, 2)


def attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float = 0.0,
    softcap: float = 0.0,
    q_num_heads: int = 0,
    kv_num_heads: int = 0,
    causal_hint: bool = False,
) -> torch.Tensor:
    """Attention in plain torch ops (the eager implementation of the custom op).

    Args:
        query: ``(B, Hq, S, D)``, or ``(B, S, Hq * D)`` with ``q_num_heads``.
        key: ``(B, Hkv, L, D)``, or ``(B, L, Hkv * D)`` with ``kv_num_heads``.
        value: ``(B, Hkv, L, Dv)``, or ``(B, L, Hkv * Dv)`` with ``kv_num_heads``.
        attn_mask: Boolean or additive mask broadcastable to ``(B, Hq, S, L)``.
        is_causal: Apply an upper-left aligned causal mask.
        scale: Factor on ``Q @ K^T``; ``0`` means ``1 / sqrt(D)``.
        softcap: Cap on the scaled scores; ``0`` disables it.
        q_num_heads: Query heads of 3-D inputs; ``0`` for 4-D inputs.
        kv_num_heads: Key/value heads of 3-D inputs; ``0`` for 4-D inputs.
        causal_hint: Recorded on the exported node only (see the module docstring).

    Returns:
        ``(B, Hq, S, Dv)`` for 4-D inputs, ``(B, S, Hq * Dv)`` for 3-D inputs.
    """
    three_d = query.dim() == 3
    if three_d:
        query = _to_heads(query, q_num_heads)
        key = _to_heads(key, kv_num_heads)
        value = _to_heads(value, kv_num_heads)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    factor = scale if scale > 0 else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * factor
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    q_len, kv_len = scores.shape[-2], scores.shape[-1]
    if is_causal:
        causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # A row with no allowed key gives zeros, as in SDPA and ONNX Attention (not NaN).
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1).masked_fill(fully_masked, 0.0)
    output = torch.matmul(weights, value)
    if three_d:
        batch, heads, seq, dim = output.shape
        output = output.transpose(1, 2).reshape(batch, seq, heads * dim)
    return output


@functools.cache
def attention_op() -> Callable[..., torch.Tensor]:
    """Define ``hyperexport::attention`` in torch's dispatcher (once per process) and return it.

    Defining the op adds a new namespace and changes no existing behaviour, so it is done once and
    kept; the export-time registrations (symbolic, translation, transformers) are scoped.
    """
    library = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    library.define(
        f"{OP_NAME}(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
        "bool is_causal=False, float scale=0.0, float softcap=0.0, int q_num_heads=0, "
        "int kv_num_heads=0, bool causal_hint=False) -> Tensor"
    )
    library.impl(OP_NAME, attention_reference, "CompositeExplicitAutograd")

    def fake(query, key, value, attn_mask=None, is_causal=False, scale=0.0, softcap=0.0,
             q_num_heads=0, kv_num_heads=0, causal_hint=False):  # fmt: skip
        if query.dim() == 3:
            width = value.shape[-1] // kv_num_heads * q_num_heads
            return query.new_empty((query.shape[0], query.shape[1], width), dtype=value.dtype)
        shape = (*query.shape[:-1], value.shape[-1])
        return query.new_empty(shape, dtype=value.dtype)

    if torch_library_has_custom_op():
        torch.library.register_fake(QUALIFIED_NAME, fake, lib=library)
    else:  # torch 2.2 and 2.3: the same registration under its earlier name
        torch.library.impl_abstract(QUALIFIED_NAME, fake, lib=library)
    _LIBRARIES.append(library)
    return getattr(torch.ops, OP_NAMESPACE).attention.default


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    softcap: float | None = None,
    q_num_heads: int = 0,
    kv_num_heads: int = 0,
    causal_hint: bool = False,
) -> torch.Tensor:
    """Call the custom op, resolving a default ``scale`` to ``1 / sqrt(head_dim)`` statically.

    The resolved scale ends up as an attribute of the exported node, so the promoted ONNX
    ``Attention`` always carries an explicit ``scale``.

    Args:
        query: See :func:`attention_reference`.
        key: See :func:`attention_reference`.
        value: See :func:`attention_reference`.
        attn_mask: See :func:`attention_reference`.
        is_causal: See :func:`attention_reference`.
        scale: Factor on ``Q @ K^T``; None for ``1 / sqrt(head_dim)``.
        softcap: Cap on the scores; None or 0 disables it.
        q_num_heads: See :func:`attention_reference`.
        kv_num_heads: See :func:`attention_reference`.
        causal_hint: See :func:`attention_reference`.

    Returns:
        The attention output, shaped as in :func:`attention_reference`.
    """
    if scale is None:
        head_dim = query.shape[-1] // q_num_heads if query.dim() == 3 else query.shape[-1]
        scale = 1.0 / math.sqrt(int(head_dim))
    return attention_op()(
        query,
        key,
        value,
        attn_mask,
        bool(is_causal),
        float(scale),
        float(softcap or 0.0),
        int(q_num_heads),
        int(kv_num_heads),
        bool(causal_hint),
    )

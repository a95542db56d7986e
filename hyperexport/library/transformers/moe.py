"""An exportable formulation of transformers' mixture-of-experts blocks, entered during export.

transformers 5.x splits a sparse MoE block into a router (``*TopKRouter``: softmax, ``topk``,
renormalisation) and the experts (``*Experts``: every expert's weights as one 3-D tensor, run by
an implementation chosen in ``config._experts_implementation``). On CPU the default is
``grouped_mm``: it counts tokens per expert with ``torch.histc`` (no TorchScript symbolic) and
multiplies with the custom op ``transformers::grouped_mm_fallback`` (no ONNX function on the
dynamo path); the ``eager`` implementation loops over the experts a batch hits (a
data-dependent loop a trace cannot keep). Neither path of ``torch.onnx.export`` converts them.

:func:`exportable_moe` swaps, for the duration of an export, the ``forward`` of the router and
experts classes listed in :data:`MOE_FAMILIES` (Mixtral, Qwen2-MoE with its shared expert,
OLMoE), and restores them in ``finally``. The modules stay separate, so both can be hiera
classes (functions inside the decoder layer's function):

* the router ranks the experts with comparisons (:func:`topk_by_rank`): the same top-k values
  as ``torch.topk``, and ties go to the lower expert index. That is the order of a stable
  descending sort and of ONNX ``TopK``. ``torch.topk`` on CPU leaves the order of ties to
  ``std::nth_element`` (it picks experts 2 and 3 of four equal scores); with equal scores at the
  k-th place the selected experts can differ from eager transformers (tests/transformers/test_moe.py
  shows both cases). Ties inside the selected set change nothing but the summation order.
* the experts run densely: every expert on every token, weighted by the routing weights
  scattered to a ``(tokens, experts)`` matrix (zero for experts not selected). Static shapes,
  three MatMuls; ``experts / top_k`` times the multiply-adds of a sparse dispatch.

Nothing outside the export changes: the eager model keeps transformers' forward.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from hyperexport.base.errors import VersionsError
from hyperexport.base.versions import experts_describe_themselves, missing_transformers_class

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoeFamily:
    """One architecture's router and experts classes, and how its router scores.

    Attributes:
        module: The transformers modeling module that defines both classes.
        router: Class name of the top-k router.
        experts: Class name of the experts (3-D ``gate_up_proj`` and ``down_proj``).
        scores_in_logit_dtype: The router casts its scores back to the logits' dtype (Qwen2-MoE,
            OLMoE); Mixtral keeps them in float32.
    """

    module: str
    router: str
    experts: str
    scores_in_logit_dtype: bool


#: The MoE blocks :func:`exportable_moe` makes exportable (transformers 5.x layout).
MOE_FAMILIES: tuple[MoeFamily, ...] = (
    MoeFamily(
        "transformers.models.mixtral.modeling_mixtral",
        "MixtralTopKRouter",
        "MixtralExperts",
        scores_in_logit_dtype=False,
    ),
    MoeFamily(
        "transformers.models.qwen2_moe.modeling_qwen2_moe",
        "Qwen2MoeTopKRouter",
        "Qwen2MoeExperts",
        scores_in_logit_dtype=True,
    ),
    MoeFamily(
        "transformers.models.olmoe.modeling_olmoe",
        "OlmoeTopKRouter",
        "OlmoeExperts",
        scores_in_logit_dtype=True,
    ),
)


def topk_by_rank(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest scores of the last dimension and their indices, without ``topk``.

    Each entry's rank is the number of entries greater than it plus the number of equal entries
    before it, so ties go to the lower index (a stable descending sort). Slot ``j`` of the
    result holds the entry of rank ``j``, taken by a one-hot sum (exact: one term is nonzero).

    Args:
        scores: ``(..., n)`` scores, no NaN.
        k: How many to keep, ``1 <= k <= n``.

    Returns:
        ``(values, indices)``, each ``(..., k)``, in descending order.
    """
    n = scores.shape[-1]
    row = scores.unsqueeze(-1)  # [..., e, 1]: the entry ranked
    col = scores.unsqueeze(-2)  # [..., 1, f]: the entries it is compared with
    positions = torch.arange(n, device=scores.device)
    before = positions.unsqueeze(-1) > positions  # [e, f]: f comes before e
    ahead = (col > row) | ((col == row) & before)
    rank = ahead.to(torch.int64).sum(dim=-1)  # [..., n]
    slots = torch.arange(k, device=scores.device)
    chosen = rank.unsqueeze(-2) == slots.unsqueeze(-1)  # [..., k, n]
    values = (chosen.to(scores.dtype) * scores.unsqueeze(-2)).sum(dim=-1)
    indices = chosen.to(torch.float32).argmax(dim=-1)
    return values, indices


def _router_forward(scores_in_logit_dtype: bool) -> Callable[..., Any]:
    """A router ``forward`` with transformers' outputs, top-k by :func:`topk_by_rank`."""

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = torch.nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
        top_value, top_index = topk_by_rank(router_probs, self.top_k)
        if getattr(self, "norm_topk_prob", True):
            top_value = top_value / top_value.sum(dim=-1, keepdim=True)
        if scores_in_logit_dtype:
            top_value = top_value.to(router_logits.dtype)
        return router_logits, top_value, top_index

    return forward


def dense_experts_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """Every expert on every token, weighted by the routing weights (zero where not routed).

    Same result as transformers' implementations of a gated experts module with concatenated,
    untransposed, bias-free weights (``gate_up_proj``: ``(experts, 2 * inter, hidden)``,
    ``down_proj``: ``(experts, hidden, inter)``), up to the order of the sum over experts.
    """
    if experts_describe_themselves():
        if self.has_bias or self.is_transposed or not self.has_gate:
            raise NotImplementedError(
                f"{type(self).__name__}: the exportable MoE formulation covers gated, "
                "untransposed, bias-free experts only"
            )
        apply_gate = self._apply_gate
    else:  # gated, untransposed and bias-free by construction (versions)
        apply_gate = _gate_of_halves(self.act_fn)
    experts = torch.arange(self.num_experts, device=hidden_states.device)
    routed = top_k_index.unsqueeze(-1) == experts  # [tokens, k, experts]
    weights = (routed.to(top_k_weights.dtype) * top_k_weights.unsqueeze(-1)).sum(dim=1)
    gate_up = torch.matmul(hidden_states.unsqueeze(0), self.gate_up_proj.transpose(1, 2))
    gated = apply_gate(gate_up)  # [experts, tokens, inter]
    out = torch.matmul(gated, self.down_proj.transpose(1, 2))  # [experts, tokens, hidden]
    out = (out * weights.transpose(0, 1).unsqueeze(-1).to(out.dtype)).sum(dim=0)
    return out.to(hidden_states.dtype)


def _gate_of_halves(act_fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``act_fn(gate) * up`` of the two halves of ``gate_up``: what the experts of
    transformers before ``TRANSFORMERS_EXPERTS_DESCRIBE_THEMSELVES`` compute per expert."""

    def apply_gate(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return act_fn(gate) * up

    return apply_gate


@contextmanager
def _swapped_forward(cls: type, forward: Callable[..., Any]) -> Iterator[None]:
    original = cls.__dict__["forward"]
    cls.forward = forward  # type: ignore[attr-defined]
    try:
        yield
    finally:
        cls.forward = original  # type: ignore[attr-defined]


@contextmanager
def exportable_moe(families: tuple[MoeFamily, ...] = MOE_FAMILIES) -> Iterator[list[str]]:
    """Swap the router and experts ``forward`` of every loaded MoE family; restore on exit.

    Only modules already imported are patched (no model of an unimported module exists), so the
    patch costs nothing for other models.

    Args:
        families: The families to patch.

    Yields:
        The names of the classes patched.
    """
    patched: list[str] = []
    with ExitStack() as stack:
        for family in families:
            module = sys.modules.get(family.module)
            if module is None:
                continue
            too_old = missing_transformers_class(f"{family.module}.{family.router}")
            if too_old:
                raise VersionsError(f"exportable MoE: {too_old}")
            router = getattr(module, family.router)
            experts = getattr(module, family.experts)
            stack.enter_context(
                _swapped_forward(router, _router_forward(family.scores_in_logit_dtype))
            )
            stack.enter_context(_swapped_forward(experts, dense_experts_forward))
            patched += [family.router, family.experts]
            log.debug("exportable MoE forward for %s and %s", family.router, family.experts)
        yield patched

"""Promote ``hyperexport.attention::Attention`` nodes to default-domain ONNX ``Attention`` (opset 24).

The custom node (emitted by :mod:`hyperexport.library.transformers.attention_onnx` on both export paths)
has the inputs ``Q, K, V[, attn_mask]`` and the attributes ``is_causal``, ``scale``, ``softcap``,
``q_num_heads``, ``kv_num_heads`` of ONNX ``Attention``, with the same meaning when no KV-cache
input is used (causal alignment is upper-left in both). The pass:

* rewrites each such node in place, in the main graph, in every function, and in subgraphs;
* keeps ``q_num_heads``/``kv_num_heads`` for 3-D inputs, drops them for 4-D inputs, and drops
  ``causal_hint`` (the mask says it all);
* raises the default-domain opset import to 24 in the model and in every function that imports
  the default domain (and, where needed, the IR version), and drops the custom domain's import;
* refuses, with :class:`~hyperexport.base.errors.RewriteError`, what it cannot promote faithfully.

Promotion implies opset 24 in the final model whatever the export opset (which stays at most 20
on the TorchScript path). Raising the opset does not convert other ops; ops whose meaning changed
after an older opset (see ``_CHANGED_SINCE``) make the pass refuse rather than guess.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from hyperexport.base.contracts.names import ATTENTION_ATTRIBUTES, ATTENTION_DOMAIN, PROMOTED_OPSET
from hyperexport.base.errors import RewriteError

log = logging.getLogger(__name__)

SOURCE_DOMAIN = ATTENTION_DOMAIN
SOURCE_OP_TYPE = "Attention"
TARGET_OPSET = PROMOTED_OPSET
# IR version required by opset 24 (onnx.helper.find_min_ir_version_for).
TARGET_IR_VERSION = 12

_KNOWN_ATTRIBUTES = frozenset(ATTENTION_ATTRIBUTES)
_HEAD_ATTRIBUTES = ("q_num_heads", "kv_num_heads")
_FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)
# Default-domain ops whose meaning (not only their type list) changed at the given opset: a
# graph importing an older opset cannot simply be re-declared at 24 if it uses them.
# At 18 the Reduce* ops (but ReduceSum, moved at 13) took ``axes`` as an input instead of an
# attribute: a TorchScript export at opset <= 17 of an RMSNorm holds ReduceMean with ``axes``.
_REDUCE_18 = (
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSumSquare",
)  # fmt: skip
_CHANGED_SINCE = {
    "DFT": 20,
    "GridSample": 20,
    "GroupNormalization": 21,
    **dict.fromkeys(_REDUCE_18, 18),
}

GraphOrFunction = ir.Graph | ir.Function


def _is_source(node: ir.Node) -> bool:
    return node.domain == SOURCE_DOMAIN and node.op_type == SOURCE_OP_TYPE


def _scope(owner: GraphOrFunction) -> str:
    return f"function {owner.identifier()}" if isinstance(owner, ir.Function) else "main graph"


def _where(owner: GraphOrFunction, node: ir.Node) -> str:
    return f"{_scope(owner)}, node {node.name or '<unnamed>'!r}"


def _rank(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return value.shape.rank()


def _check_inputs(node: ir.Node, where: str) -> int:
    """Validate inputs and attributes; return the input rank (3 or 4)."""
    inputs = list(node.inputs)
    if len(inputs) not in (3, 4) or any(value is None for value in inputs[:3]):
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: expected inputs Q, K, V[, attn_mask], "
            f"got {len(inputs)}"
        )
    unknown = set(node.attributes) - _KNOWN_ATTRIBUTES
    if unknown:
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: attributes {sorted(unknown)} have no ONNX "
            "Attention equivalent"
        )
    if len(node.outputs) != 1:
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: expected one output, got {len(node.outputs)}"
        )
    ranks = {rank for rank in map(_rank, inputs[:3]) if rank is not None}
    heads = [node.attributes.get_int(name, 0) for name in _HEAD_ATTRIBUTES]
    if len(ranks) > 1:
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: Q, K, V have different ranks {sorted(ranks)}"
        )
    rank = ranks.pop() if ranks else (3 if heads[0] else 4)
    if rank not in (3, 4):
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: inputs are {rank}-D, not 3-D/4-D"
        )
    if rank == 3 and not all(heads):
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: 3-D inputs need q_num_heads and kv_num_heads"
        )
    if rank == 3 and heads[0] % heads[1]:
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: q_num_heads={heads[0]} is not a multiple of "
            f"kv_num_heads={heads[1]}"
        )
    _check_types(inputs, where)
    return rank


def _check_types(inputs: list[ir.Value | None], where: str) -> None:
    q_type = inputs[0].dtype if inputs[0] is not None else None
    if q_type is not None and q_type not in _FLOAT_TYPES:
        raise RewriteError(f"PromoteAttentionToOpset24Pass: {where}: Q has type {q_type}")
    mask = inputs[3] if len(inputs) == 4 else None
    if mask is None or mask.dtype is None or q_type is None:
        return
    if mask.dtype != ir.DataType.BOOL and mask.dtype != q_type:
        raise RewriteError(
            f"PromoteAttentionToOpset24Pass: {where}: attn_mask of type {mask.dtype} is neither "
            f"bool nor Q's type {q_type}"
        )


def _promote(node: ir.Node, rank: int) -> None:
    """Rewrite one custom node into default-domain Attention, in place."""
    if rank == 4:
        for name in _HEAD_ATTRIBUTES:
            node.attributes.pop(name, None)
    # Only ONNX Runtime's GroupQueryAttention needs it: ONNX Attention follows the mask.
    node.attributes.pop("causal_hint", None)
    if node.attributes.get_int("is_causal", 0) == 0:
        node.attributes.pop("is_causal", None)
    if node.attributes.get_float("softcap", 0.0) == 0.0:
        node.attributes.pop("softcap", None)
    node.domain = ""
    node.op_type = "Attention"
    node.version = None


def _check_opset_raise(owner: GraphOrFunction, where: str) -> None:
    """Refuse to re-declare an opset under ops whose meaning changed since it."""
    current = owner.opset_imports.get("", TARGET_OPSET)
    for node in ir.traversal.RecursiveGraphIterator(owner):
        changed = _CHANGED_SINCE.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if changed is not None and current < changed <= TARGET_OPSET:
            raise RewriteError(
                f"PromoteAttentionToOpset24Pass: {where}: {node.op_type} changed meaning at opset "
                f"{changed}; cannot raise opset {current} to {TARGET_OPSET} without converting it"
            )


def _uses_domain(owner: GraphOrFunction, domain: str) -> bool:
    return any(node.domain == domain for node in ir.traversal.RecursiveGraphIterator(owner))


class PromoteAttentionToOpset24Pass(ir.passes.InPlacePass):
    """Rewrite ``hyperexport.attention::Attention`` into ONNX ``Attention`` at opset 24.

    Visits the main graph, every function and their subgraphs. A second run changes nothing.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        owners: list[GraphOrFunction] = [model.graph, *model.functions.values()]
        # Validate everything first, so that a refusal leaves the model untouched.
        found: list[tuple[ir.Node, int]] = []
        raised: list[GraphOrFunction] = []
        for owner in owners:
            nodes = [n for n in ir.traversal.RecursiveGraphIterator(owner) if _is_source(n)]
            found.extend((node, _check_inputs(node, _where(owner, node))) for node in nodes)
            if nodes or "" in owner.opset_imports or owner is model.graph:
                raised.append(owner)
        if not found:
            return ir.passes.PassResult(model, modified=False)
        for owner in raised:
            _check_opset_raise(owner, _scope(owner))
        for node, rank in found:
            _promote(node, rank)
        for owner in raised:
            owner.opset_imports[""] = max(owner.opset_imports.get("", 0), TARGET_OPSET)
        for owner in owners:
            if SOURCE_DOMAIN in owner.opset_imports and not _uses_domain(owner, SOURCE_DOMAIN):
                del owner.opset_imports[SOURCE_DOMAIN]
        model.ir_version = max(model.ir_version, TARGET_IR_VERSION)
        log.debug("promoted %d attention node(s) to ONNX Attention (opset 24)", len(found))
        return ir.passes.PassResult(model, modified=True)


def declare_opset24(model: ir.Model) -> bool:
    """Re-declare the main graph and every function importing the default domain at opset 24
    (and the model at IR 12), refusing as the promotion does when an op changed meaning since
    the current opset. Returns whether anything changed (False on a second call)."""
    owners: list[GraphOrFunction] = [model.graph, *model.functions.values()]
    raised = [o for o in owners if o is model.graph or "" in o.opset_imports]
    stale = [o for o in raised if o.opset_imports.get("", 0) < TARGET_OPSET]
    for owner in stale:
        _check_opset_raise(owner, _scope(owner))
    for owner in stale:
        owner.opset_imports[""] = TARGET_OPSET
    modified = bool(stale) or model.ir_version < TARGET_IR_VERSION
    model.ir_version = max(model.ir_version, TARGET_IR_VERSION)
    return modified

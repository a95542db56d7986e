"""``FuseOpsPass``: fused kernels inside the functions (``rewrite.fuse``).

The rules are onnxscript rewriter pattern rules (``fuse_norms``, ``fuse_rotary``,
``fuse_attention``, ``fuse_gelu``), matched in the main graph and in every function body, so a
per-type layer function stays one function called once per layer: its body changes, its
inputs, outputs and call sites do not. The fusion is declared per kind in :data:`STEPS`:

* ``standard`` (portable, ONNX only): the model is declared at opset 24 (as attention promotion
  always did; refused when an op changed meaning since the export opset), RMSNorm becomes
  ``RMSNormalization`` and rotary embeddings ``RotaryEmbedding`` (opset 23), and the exported
  attention nodes ONNX ``Attention`` (:class:`~hyperexport.library.passes.promote_attention.PromoteAttentionToOpset24Pass`).
* ``onnxruntime`` (ONNX Runtime only, ``com.microsoft``): as onnxruntime-genai's model builder
  writes models for the CPU: ``GroupQueryAttention`` (``MultiHeadAttention`` for an encoder's
  attention), ``RotaryEmbedding``, ``SkipSimplifiedLayerNormalization``/``SkipLayerNormalization``,
  ``FastGelu``/``Gelu``/``QuickGelu``. An exported attention
  node no rule could fuse is a :class:`~hyperexport.base.errors.RewriteError` with the reason (ONNX
  Runtime has no kernel for it).

In both, bodies are first put in the form the rules are written for (``_normalize``): no-op
``Cast``/``Identity`` nodes go (the exporters write them; the patterns do not look through
them), and the constant operand of each ``Add``/``Mul`` goes second (so that a rule lists only
the orders of products of computed values, not every permutation: the rule sets stay small).

Shapes the rules need (head counts, the head size, ranks) come from ONNX shape inference over
each body while the rules run (``fuse_values.annotated``); the model keeps the shapes it had.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.rewriter import pattern

from hyperexport.base.errors import RewriteError
from hyperexport.library.options import Fusion
from hyperexport.library.passes import (
    fuse_attention,
    fuse_gelu,
    fuse_layout,
    fuse_norms,
    fuse_rotary,
)
from hyperexport.library.passes.fuse_values import annotated, constant_array, dtype
from hyperexport.library.passes.promote_attention import (
    PromoteAttentionToOpset24Pass,
    declare_opset24,
)

log = logging.getLogger(__name__)

Step = Callable[[ir.Model], int]


def apply_rules(model: ir.Model, rules: list[pattern.RewriteRule]) -> int:
    """Apply one rule set to the main graph and every function, with inferred shapes on the
    values while it runs; the number of rewrites."""
    rule_set = pattern.RewriteRuleSet(rules)
    with annotated(model):
        return rule_set.apply_to_model(model)


def _rules(make: Callable[[], list[pattern.RewriteRule]]) -> Step:
    """A step applying one rule set (each rule lists the operand orders it matches)."""

    def apply(model: ir.Model) -> int:
        return apply_rules(model, make())

    return apply


def _declare_opset24(model: ir.Model) -> int:
    return int(declare_opset24(model))


def _promote_attention(model: ir.Model) -> int:
    return int(PromoteAttentionToOpset24Pass()(model).modified)


def _normalize(model: ir.Model) -> int:
    """Put bodies in the form the rules are written for: no ``Identity`` or same-type ``Cast``
    (unless it gives an output), and the constant operand of ``Add``/``Mul`` second."""
    changes = 0
    with annotated(model):
        owners: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
        for owner in owners:
            outputs = set(owner.outputs)
            for node in list(owner):
                if _is_noop(node) and node.outputs[0] not in outputs:
                    source = node.inputs[0]
                    assert source is not None
                    ir.convenience.replace_all_uses_with(node.outputs[0], source)
                    owner.remove(node, safe=True)
                    changes += 1
                elif _constant_first(node):
                    first, second = node.inputs
                    node.replace_input_with(0, second)
                    node.replace_input_with(1, first)
                    changes += 1
    return changes


def _is_noop(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or len(node.inputs) != 1 or node.inputs[0] is None:
        return False
    if node.op_type == "Identity":
        return True
    if node.op_type != "Cast":
        return False
    source = dtype(node.inputs[0])
    return source is not None and int(source) == node.attributes.get_int("to", 0)


def _constant_first(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Add", "Mul"):
        return False
    if len(node.inputs) != 2:
        return False
    first, second = node.inputs
    return constant_array(first) is not None and constant_array(second) is None


def _remove_unused_nodes(model: ir.Model) -> int:
    return int(RemoveUnusedNodesPass()(model).modified)


def _refuse_unfused_attention(model: ir.Model) -> int:
    """Every exported attention node must have become a kernel: name the first that did not."""
    with annotated(model):
        for function in model.functions.values():
            for node in function:
                if fuse_attention.is_attention(node):
                    try:
                        fuse_attention.attention_plan(node)
                        reason = "no rule matched it"
                    except fuse_attention.AttentionRefusal as e:
                        reason = str(e)
                    # over a cache, the cached rule's refusal is the one that names the cause
                    reason = fuse_attention.cache_refusal(node) or reason
                    raise RewriteError(
                        f"rewrite.fuse=onnxruntime: attention node {node.name!r} in function "
                        f"{function.name} has no ONNX Runtime kernel: {reason}"
                    )
    for node in model.graph:
        if fuse_attention.is_attention(node):
            raise RewriteError(
                f"rewrite.fuse=onnxruntime: attention node {node.name!r} in the main graph is "
                "not fused (only function bodies are)"
            )
    return 0


#: Each fusion, in order: its steps (each returns how many changes it made).
STEPS: dict[str, tuple[Step, ...]] = {
    "standard": (
        _declare_opset24,
        _normalize,
        _rules(lambda: [*fuse_norms.standard_rules(), *fuse_rotary.rules("standard")]),
        _promote_attention,
    ),
    "onnxruntime": (
        _normalize,
        _rules(
            lambda: [
                *fuse_attention.rules(),
                *fuse_rotary.rules("onnxruntime"),
                *fuse_norms.onnxruntime_rules(),
                *fuse_gelu.rules(),
            ]
        ),
        _remove_unused_nodes,  # dead readers of the heads, before fuse_layout counts them
        fuse_layout.rotary_on_projections,
        fuse_layout.cancel_round_trips,
        _refuse_unfused_attention,
    ),
}


class FuseOpsPass(ir.passes.InPlacePass):
    """Replace subgraphs by fused kernels in the main graph and every function.

    Args:
        fusion: ``standard`` or ``onnxruntime`` (see the module docstring).
    """

    def __init__(self, fusion: Fusion) -> None:
        super().__init__()
        if fusion not in STEPS:
            raise ValueError(f"fusion must be one of {sorted(STEPS)}, got {fusion!r}")
        self.fusion = fusion

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        changes = [step(model) for step in STEPS[self.fusion]]
        log.debug("fusion %s: %s changes", self.fusion, changes)
        return ir.passes.PassResult(model, modified=any(changes))

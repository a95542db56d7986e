"""The generation step's KV cache as onnxruntime-genai's shared buffer
(``past_present_share_buffer: true``), after ``rewrite.fuse=onnxruntime`` made each decoder
layer's attention a ``GroupQueryAttention`` over the past (``fuse_attention.CachedAttentionRule``).

With a shared buffer, onnxruntime-genai allocates each ``past_key_values.<i>.key/value`` once,
``(batch, kv_heads, max_length, head)``, and binds the matching ``present.<i>.key/value`` to the
same memory: the kernel writes the new rows in place, after the valid ones, and nothing is
concatenated or copied. The valid length is no longer the past's dim 2: it is
``attention_mask``'s length less ``input_ids``' (the new tokens). So:

* in each function whose ``GroupQueryAttention`` takes a function input as ``past_key`` /
  ``past_value``, that input becomes a buffer: every ``Shape`` of it gives the valid length at
  dim 2 (the attention mask's last dim, the total length, less the new keys), which is what the
  fused attention's ``seqlens_k`` / ``total_sequence_length`` are computed from; any other use is
  refused (it would read rows beyond the valid ones);
* in the main graph each ``past_key_values.*`` input that reaches such a function input becomes
  a buffer too: a call site passes it as it is (single-input ``Concat``/``Identity`` nodes the
  exporters left between them go), a ``Shape`` of it gives the valid length
  (``attention_mask`` length less ``input_ids`` length), and any other use gets the valid rows
  (``Slice``).

The functions' inputs and outputs keep their number and order (per_type stays one function per
layer structure); what changes is that a past may be longer than its valid rows and a present
is ``max(total, past length)`` long, GroupQueryAttention's rule. A past exactly as long as its
valid rows (what the capture recorded, and what a decode that feeds each present back as the
next past gives) is a buffer like any other: the present is then the past plus the new rows.
The check's adapter (``check/kv_buffer.py``) also runs each step with its pasts padded and
compares the presents' valid rows.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import onnx_ir as ir
from onnx_ir.passes.common import TopologicalSortPass

from hyperexport.base.errors import RewriteError
from hyperexport.library.passes.ir_build import insert_ints, insert_op

log = logging.getLogger(__name__)

#: ONNX Runtime's contrib domain (as ``fuse_attention.MS_DOMAIN``, not imported from there: the
#: manifest reads :func:`shared_buffer_inputs` and must not load onnxscript's rewriter).
MS_DOMAIN = "com.microsoft"

#: onnxruntime-genai's decoder inputs the valid past length is computed from, and its past names.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
PAST_NAME = re.compile(r"past_key_values\.\d+\.(key|value)$")
#: GroupQueryAttention's inputs: past_key, past_value, attention_bias.
_PAST_SLOTS = (3, 4)
_BIAS_SLOT = 10
_KEY_SLOT = 1


@dataclass(frozen=True)
class SharedBuffers:
    """What :func:`share_kv_buffer` made buffers: each function's buffer inputs (indices),
    and the main graph's buffer inputs (names)."""

    functions: dict[str, tuple[int, ...]]
    graph_inputs: tuple[str, ...]


def _valid_shape(
    owner: ir.Graph | ir.Function, shape_node: ir.Node, buffer: ir.Value, length: ir.Value
) -> ir.Value:
    """``Shape(buffer)`` with dim 2 the valid ``length`` (1-D), cut as ``shape_node`` cuts it."""
    name = shape_node.name or "shape"
    head = insert_op(owner, shape_node, "Shape", [buffer], f"{name}_head", start=0, end=2)
    tail = insert_op(owner, shape_node, "Shape", [buffer], f"{name}_tail", start=3)
    full = insert_op(owner, shape_node, "Concat", [head, length, tail], f"{name}_valid", axis=0)
    start = shape_node.attributes.get_int("start", 0)
    end = shape_node.attributes.get_int("end", 4)
    if (start, end) == (0, 4):
        return full
    starts = insert_ints(owner, shape_node, [start], f"{shape_node.name}_starts")
    ends = insert_ints(owner, shape_node, [end], f"{shape_node.name}_ends")
    return insert_op(owner, shape_node, "Slice", [full, starts, ends], f"{name}_cut")


def _replace_shapes(
    owner: ir.Graph | ir.Function, buffer: ir.Value, length_of: ir.Value, allowed: set[int]
) -> list[str]:
    """Every ``Shape`` of ``buffer`` gives the valid length; the uses that are neither a Shape
    nor an ``allowed`` consumer (by id) are returned (their op types), untouched."""
    others = []
    for usage in list(buffer.uses()):
        node = usage.node
        if id(node) in allowed:
            continue
        if node.op_type == "Shape" and node.domain in ("", "ai.onnx"):
            valid = _valid_shape(owner, node, buffer, length_of)
            ir.convenience.replace_all_uses_with(node.outputs[0], valid)
            owner.remove(node, safe=True)
            continue
        others.append(node.op_type)
    return others


def _buffer_functions(model: ir.Model) -> dict[ir.OperatorIdentifier, dict[int, list[ir.Node]]]:
    """Per function: each input that is a GroupQueryAttention's past, with those nodes."""
    found: dict[ir.OperatorIdentifier, dict[int, list[ir.Node]]] = {}
    for ident, function in model.functions.items():
        index = {id(v): i for i, v in enumerate(function.inputs)}
        for node in function:
            if node.domain != MS_DOMAIN or node.op_type != "GroupQueryAttention":
                continue
            for slot in _PAST_SLOTS:
                past = node.inputs[slot] if len(node.inputs) > slot else None
                if past is not None and id(past) in index:
                    found.setdefault(ident, {}).setdefault(index[id(past)], []).append(node)
    return found


def _function_buffers(function: ir.Function, inputs: dict[int, list[ir.Node]]) -> None:
    """Make ``function``'s past inputs buffers: each Shape of one gives the valid length."""
    for i, nodes in sorted(inputs.items()):
        buffer = function.inputs[i]
        gqa = nodes[0]
        bias = gqa.inputs[_BIAS_SLOT] if len(gqa.inputs) > _BIAS_SLOT else None
        key = gqa.inputs[_KEY_SLOT]
        if bias is None or key is None:
            raise RewriteError(
                f"rewrite.fuse=onnxruntime: the shared KV buffer of {function.name}'s input "
                f"{buffer.name!r}: its GroupQueryAttention has no attention mask, which gives "
                "the valid length of the past"
            )
        # valid past = total (the mask's last dim) - new keys (dim 1 of the 3-D key); the
        # Shapes this replaces may come earlier: the pass sorts the bodies at the end.
        total = insert_op(function, gqa, "Shape", [bias], f"{buffer.name}_total", start=3, end=4)
        new = insert_op(function, gqa, "Shape", [key], f"{buffer.name}_new", start=1, end=2)
        length = insert_op(function, gqa, "Sub", [total, new], f"{buffer.name}_valid")
        others = _replace_shapes(function, buffer, length, {id(n) for n in nodes})
        if others:
            raise RewriteError(
                f"rewrite.fuse=onnxruntime: the shared KV buffer: {function.name}'s input "
                f"{buffer.name!r} is also read by {sorted(set(others))}, which would see rows "
                "beyond the valid ones"
            )


def _bypass_copies(graph: ir.Graph, value: ir.Value) -> None:
    """Single-input ``Concat``/``Identity`` nodes reading ``value`` go; their uses read it."""
    for usage in list(value.uses()):
        node = usage.node
        single_concat = node.op_type == "Concat" and len(node.inputs) == 1
        if node.domain in ("", "ai.onnx") and (single_concat or node.op_type == "Identity"):
            if node.outputs[0] in graph.outputs:
                continue
            _bypass_copies(graph, node.outputs[0])
            ir.convenience.replace_all_uses_with(node.outputs[0], value)
            graph.remove(node, safe=True)


def share_kv_buffer(model: ir.Model) -> SharedBuffers | None:
    """Make the generation step's pasts onnxruntime-genai's shared buffers (module docstring);
    None when the model is no generation step with GroupQueryAttention over its pasts.

    Raises:
        RewriteError: Where a past is used in a way a buffer cannot be (naming the function
            and the use), or a function with a buffer is called from another function.
    """
    functions = _buffer_functions(model)
    graph = model.graph
    names = {v.name: v for v in graph.inputs}
    pasts = [v for v in graph.inputs if v.name and PAST_NAME.match(v.name)]
    if not functions or INPUT_IDS not in names or ATTENTION_MASK not in names or not pasts:
        return None
    for ident, function in model.functions.items():
        for node in function:
            if (node.domain, node.op_type, node.overload) in functions:
                raise RewriteError(
                    f"rewrite.fuse=onnxruntime: the shared KV buffer: {node.op_type} is called "
                    f"from function {ident[1]}, not from the main graph"
                )
    for ident, inputs in functions.items():
        _function_buffers(model.functions[ident], inputs)
    for past in pasts:
        _bypass_copies(graph, past)
    first = next(iter(graph))
    ids_len = insert_op(
        graph, first, "Shape", [names[INPUT_IDS]], "past_length_new", start=1, end=2
    )
    mask_len = insert_op(
        graph, first, "Shape", [names[ATTENTION_MASK]], "past_length_total", start=1, end=2
    )
    length = insert_op(graph, first, "Sub", [mask_len, ids_len], "past_length")
    buffers = []
    for past in pasts:
        calls = {
            id(u.node)
            for u in past.uses()
            if (u.node.domain, u.node.op_type, u.node.overload) in functions
            and u.idx in functions[(u.node.domain, u.node.op_type, u.node.overload)]
        }
        if not calls:
            continue
        others = _replace_shapes(graph, past, length, calls)
        if others:
            # Placed before the length it reads: the sort at the end orders them.
            anchor = length.producer()
            assert anchor is not None
            starts = insert_ints(graph, anchor, [0], f"{anchor.name}_starts")
            axes = insert_ints(graph, anchor, [2], f"{anchor.name}_axes")
            valid = insert_op(
                graph, anchor, "Slice", [past, starts, length, axes], f"{past.name}_valid"
            )
            for usage in list(past.uses()):
                if id(usage.node) not in calls and usage.node is not valid.producer():
                    usage.node.replace_input_with(usage.idx, valid)
        buffers.append(past.name or "")
    TopologicalSortPass()(model)
    log.info("shared KV buffer: %d pasts, %d functions", len(buffers), len(functions))
    return SharedBuffers(
        functions={ident[1]: tuple(sorted(inputs)) for ident, inputs in functions.items()},
        graph_inputs=tuple(buffers),
    )


#: ``model.metadata_props`` key the pass sets: the pasts are onnxruntime-genai's shared buffers.
META_KV_BUFFER = "hyperexport.kv_buffer"
SHARED = "shared"


def shared_buffer_inputs(model: ir.Model) -> dict[str, tuple[int, ...]]:
    """The inputs that are shared KV buffers, by owner (``""``: the main graph's, by input
    position; else a function's name); empty unless :class:`ShareKVBufferPass` made them."""
    if model.metadata_props.get(META_KV_BUFFER) != SHARED:
        return {}
    found = {ident[1]: tuple(sorted(i)) for ident, i in _buffer_functions(model).items()}
    graph = [
        i
        for i, v in enumerate(model.graph.inputs)
        if v.name
        and PAST_NAME.match(v.name)
        and any(
            (u.node.domain, u.node.op_type, u.node.overload) in model.functions for u in v.uses()
        )
    ]
    return {"": tuple(graph), **found} if graph else found


class ShareKVBufferPass(ir.passes.InPlacePass):
    """:func:`share_kv_buffer` as a pass; ``modified`` only where it made buffers (the model
    then records it in ``metadata_props``, :data:`META_KV_BUFFER`)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.metadata_props.get(META_KV_BUFFER) == SHARED:
            return ir.passes.PassResult(model, modified=False)  # buffers already
        shared = share_kv_buffer(model)
        if shared is not None:
            model.metadata_props[META_KV_BUFFER] = SHARED
        return ir.passes.PassResult(model, modified=shared is not None)

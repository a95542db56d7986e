"""The main graph's attention mask as the padding mask alone, where only fused causal attention
reads it (``rewrite.fuse: onnxruntime``, a generation step).

transformers builds each step's 4-D boolean mask, ``(batch, 1, new, total)``, from the 2-D
``attention_mask``: causal and padding, with the past's offset. Exported, that is some forty
kernels of ranges, comparisons and reshapes in the main graph, run once per decode step; at
8 layers and hidden 256 they cost about 4% of an int4 step in ONNX Runtime (issue 35, measured in
``bench/README.md``). After the fusion, each layer function reads the mask only where that
cannot matter for the causal part:

* ``Shape`` of it (the sizes the fused kernels need), and
* ``Where(mask, a, b)`` whose every use is a ``GroupQueryAttention``'s ``attention_bias``.

``GroupQueryAttention`` is causal: it never reads the bias of a key after the query's own
position. So wherever the mask agrees with the padding mask on the positions causality allows,
the padding mask broadcast to the same shape computes the same outputs, whatever the mask holds
after them. That agreement is a property of the model's mask, not of its graph's shape, and
transformers' releases build the mask differently; the pass does not match the mask's nodes.
It evaluates the mask's own subgraph with ONNX Runtime on probe inputs (:data:`PROBES`: prompts,
left padding, chunks and decode steps over a past, long decodes that a sliding window would
show in) and replaces it only when every probe agrees on every allowed position. A mask that
differs there (a sliding window, a row transformers unmasks, a bidirectional prefix) is kept,
with an INFO line naming the first probe it differs on. The probes see windows narrower than
the longest probe's length (:data:`LONGEST`); the check stage compares the whole model and every
call site with torch afterwards.

The replacement, in the main graph: ``Expand(Unsqueeze(Cast(attention_mask, bool), [1, 2]),
[1, 1, new, 1])``, five kernels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from hyperexport.library.passes.fuse_layout import is_op
from hyperexport.library.passes.fuse_values import annotated
from hyperexport.library.passes.graph_probe import (
    BATCH,
    NEW,
    PAST,
    POSITION_IDS,
    TOTAL,
    Subgraph,
    Unprobeable,
    probe_session,
    subgraph,
)
from hyperexport.library.passes.ort_kernels import GQA_INPUTS, MS_DOMAIN
from hyperexport.library.passes.share_kv_buffer import ATTENTION_MASK, INPUT_IDS

log = logging.getLogger(__name__)

_BIAS_SLOT = GQA_INPUTS.index("attention_bias")
#: The longest probe's total length: windows narrower than this show in the probes.
LONGEST = 65537
#: Probe inputs: (new tokens, total length, left padding of each row).
PROBES: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 1, (0,)),
    (4, 4, (0,)),
    (5, 5, (0, 2)),
    (3, 9, (1, 0)),
    (1, 7, (0, 3)),
    (1, 4097, (0, 5)),
    (1, LONGEST, (0,)),
)
#: The probes' inputs may hold at most this many bytes (a past or an embedding whose sizes
#: the mask reads, fed as zeros).
PROBE_BYTES = 1 << 29


@dataclass(frozen=True)
class MaskUse:
    """A main-graph mask every reader of which is a fused causal attention, through calls.

    Attributes:
        value: The main-graph value.
        calls: The call nodes that pass it (with the input positions).
    """

    value: ir.Value
    calls: tuple[tuple[ir.Node, int], ...]


class PaddingMaskPass(ir.passes.InPlacePass):
    """Replace a causal-and-padding mask only fused causal attention reads by the padding mask."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        inputs = {v.name: v for v in graph.inputs}
        mask, ids = inputs.get(ATTENTION_MASK), inputs.get(INPUT_IDS)
        if mask is None or ids is None:
            return ir.passes.PassResult(model, modified=False)
        with annotated(model):  # one shape inference for every mask's probes
            verdicts = [
                (use, _first_difference(model, use.value))
                for use in causal_only_masks(model)
                if not _is_padding_mask(use.value)  # made by this pass already
            ]
        replaced = 0
        padding: ir.Value | None = None  # one for every mask it replaces: they are all equal
        for use, differs in verdicts:
            if differs is not None:
                log.info("padding mask: kept the main graph's %r: %s", use.value.name, differs)
                continue
            if padding is None:
                padding = _padding_mask(graph, mask, ids, before=use.calls[0][0])
            for node, position in use.calls:
                node.replace_input_with(position, padding)
            replaced += 1
        if replaced:
            log.info("padding mask: %d main-graph masks now the padding mask alone", replaced)
        return ir.passes.PassResult(model, modified=bool(replaced))


def causal_only_masks(model: ir.Model) -> list[MaskUse]:
    """The main graph's node outputs that only function calls read, each at inputs the
    function reads only through ``Shape`` and the ``Where`` of a ``GroupQueryAttention`` bias."""
    safe = {
        ident: {i for i, v in enumerate(f.inputs) if _causal_only(v)}
        for ident, f in model.functions.items()
    }
    found = []
    for node in model.graph:
        for value in node.outputs:
            uses = list(value.uses())
            if not uses or value in model.graph.outputs:
                continue
            calls = []
            for usage in uses:
                ident = usage.node.op_identifier()
                if ident not in safe or usage.idx not in safe[ident]:
                    break
                calls.append((usage.node, usage.idx))
            else:
                found.append(MaskUse(value, tuple(calls)))
    return found


def _causal_only(value: ir.Value) -> bool:
    """Whether a function input is read only by ``Shape`` and by ``Where`` nodes (it the
    condition) whose every use is a ``GroupQueryAttention``'s ``attention_bias``, and by one
    such ``Where`` at least."""
    uses = list(value.uses())
    if all(is_op(u.node, "Shape") for u in uses):
        return False
    for usage in uses:
        node = usage.node
        if is_op(node, "Shape"):
            continue
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or usage.idx != 0:
            return False
        readers = list(node.outputs[0].uses())
        if not any(_is_bias(u) for u in readers) or not all(
            _is_bias(u) or is_op(u.node, "Shape") for u in readers
        ):
            return False
    return True


def _is_bias(usage: Any) -> bool:
    """A use (``Value.uses()``'s ``(node, idx)``) as a GroupQueryAttention's bias."""
    node = usage.node
    return (
        node.domain == MS_DOMAIN
        and node.op_type == "GroupQueryAttention"
        and usage.idx == _BIAS_SLOT
    )


# -- the probes ---------------------------------------------------------------------------------


def first_difference(model: ir.Model, value: ir.Value) -> str | None:
    """None when the main graph's ``value`` agrees with the padding mask on every position
    causality allows, on every probe; else what differs (or why the probes cannot run)."""
    with annotated(model):
        return _first_difference(model, value)


def _first_difference(model: ir.Model, value: ir.Value) -> str | None:
    """:func:`first_difference`, the model's shapes inferred (``annotated``) by the caller."""
    try:
        probe = _Probe(subgraph(model, [value], "padding_mask_probe", onnx.TensorProto.BOOL))
    except Unprobeable as e:
        return str(e)
    session = probe_session(probe.graph.model)
    for new, total, pads in PROBES:
        feeds = probe.feeds(new, total, pads)
        if feeds is None:
            return f"the probe of {total} positions would need over {PROBE_BYTES} bytes of inputs"
        [got] = session.run(None, feeds)
        padding = _padding(total, pads)
        if got.dtype != np.bool_ or got.shape != (len(pads), 1, new, total):
            return f"it is {got.dtype} {got.shape}, not a boolean (batch, 1, new, total) mask"
        allowed = np.arange(total)[None, :] <= (total - new + np.arange(new))[:, None]
        expected = np.broadcast_to(padding[:, None, None, :], got.shape)
        wrong = (got != expected) & allowed[None, None]
        if wrong.any():
            b, _, s, t = (int(i) for i in np.argwhere(wrong)[0])
            return (
                f"with {new} new tokens of {total}, left padding {list(pads)}, row {b} "
                f"token {s} {'reads' if got[b, 0, s, t] else 'skips'} position {t}"
            )
    return None


@dataclass(frozen=True)
class _Probe:
    """The mask's subgraph (``graph_probe.subgraph``) and how to feed it."""

    graph: Subgraph

    def feeds(self, new: int, total: int, pads: tuple[int, ...]) -> dict[str, np.ndarray] | None:
        """One probe's inputs: the mask left-padded, positions as transformers counts them,
        and zeros of their sizes for the rest; None if they would exceed PROBE_BYTES."""
        padding = _padding(total, pads)
        sizes = {BATCH: len(pads), NEW: new, TOTAL: total, PAST: total - new}
        feeds: dict[str, np.ndarray] = {}
        size = 0
        for name, dtype, dims in self.graph.inputs:
            if name == ATTENTION_MASK:
                array = padding.astype(dtype)
            elif name == POSITION_IDS:
                counted = np.cumsum(padding, axis=1) - 1
                array = np.where(padding, counted, 1)[:, total - new :].astype(dtype)
            else:
                assert dims is not None  # _subgraph
                shape = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
                if int(np.prod(shape)) * dtype.itemsize + size > PROBE_BYTES:
                    return None
                array = np.zeros(shape, dtype)
            size += array.nbytes
            feeds[name] = array
        return feeds


def _padding(total: int, pads: tuple[int, ...]) -> np.ndarray:
    return np.arange(total)[None, :] >= np.asarray(pads)[:, None]


# -- the replacement ----------------------------------------------------------------------------


def _padding_mask(graph: ir.Graph, mask: ir.Value, ids: ir.Value, *, before: ir.Node) -> ir.Value:
    """``Expand(Unsqueeze(Cast(mask, bool), [1, 2]), [1, 1, new, 1])`` before ``before``."""

    def add(op: str, inputs: list[ir.Value], name: str, **attributes: object) -> ir.Value:
        node = ir.node(op, inputs, attributes=attributes, name=f"padding_mask_{name}")  # type: ignore[arg-type]
        graph.insert_before(before, node)
        return node.outputs[0]

    def ints(values: list[int], name: str) -> ir.Value:
        return add("Constant", [], name, value_ints=values)

    flags = add("Cast", [mask], "cast", to=ir.DataType.BOOL)
    rows = add("Unsqueeze", [flags, ints([1, 2], "axes")], "unsqueeze")
    new = add("Shape", [ids], "new", start=1, end=2)
    shape = add("Concat", [ints([1, 1], "ones"), new, ints([1], "one")], "shape", axis=0)
    return add("Expand", [rows, shape], _PADDING_MASK)


#: The padding mask's own node (its name's suffix): the mask this pass made.
_PADDING_MASK = "expand"


def _is_padding_mask(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.name == f"padding_mask_{_PADDING_MASK}"

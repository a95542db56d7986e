"""Each generation step's rotary tables as constants its attention reads by position, as
onnxruntime-genai's builder makes them (``rewrite.fuse: onnxruntime``, a known context length).

After ``rotary_in_attention`` a decoder layer's ``GroupQueryAttention`` rotates by per-token
rows: the function takes transformers' ``cos`` and ``sin`` (``(batch, seq, head)``, computed in
the main graph from ``position_ids`` every step), cuts their first halves into ``batch * seq``
rows numbered ``0 ..`` (``fuse_rotary``) and pads them to the total length. Here:

* the tables are main-graph initializers of ``positions`` rows (the context length),
  what the main graph's own ``cos`` and ``sin`` give for positions ``0 .. positions - 1``,
  computed once by ONNX Runtime from that subgraph (``graph_probe.subgraph``);
* the function takes ``position_ids`` and the two tables in place of ``cos`` and ``sin``, and
  the attention reads row ``position_ids[b, s]`` for token ``(b, s)``.

Per step that removes the rotary subgraph, the rows and their padding: 23 of 136 kernels at 8
layers and hidden 256 (``bench/README.md``).

Why that computes the same: the kernel rotates each token by the table row its position names
(``ort_kernels.gqa_rotates_by_position_ids``, asked by ``rotary_in_attention``), and the main
graph's ``cos``/``sin`` of a token must be that row. That holds where they are a function of
the token's position alone; a scaling that depends on the sequence's length (dynamic or
long-context RoPE) breaks it. So the pass evaluates the subgraph on probe positions
(:func:`probes`: a prompt, a left-padded batch, the last position alone) and compares each with
the tables' rows; where one differs, or the subgraph reads anything but ``position_ids``, or the
halves do not repeat, the per-token rows stay, with an INFO line saying why.

What a layer function takes changes: ``cos`` and ``sin`` go; ``position_ids``, which
``KVStep`` is called with (the capture has it), comes among its data inputs, and the tables
among its weights. The manifest is read off the final model (``build_manifest.py``), so the
check feeds each call site its captured ``position_ids`` and the tables as it feeds weights:
every call site is still compared with torch, and no adapter is needed. A function whose calls
did not capture ``position_ids`` is left as it was.

The tables hold ``positions`` rows: the kernel refuses a longer total length (ONNX Runtime's
error, as with the builder's tables); onnxruntime-genai's ``max_length`` defaults to the
context length (``tasks/genai_config.py``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass

from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, leaf_names
from hyperexport.library.model_file import keep_in_model_file
from hyperexport.library.passes.call_sites import call_sites, drop_inputs, insert_input
from hyperexport.library.passes.compose_functions import CHILD_INDEX
from hyperexport.library.passes.fuse_layout import ATTENTION_KERNEL, is_op
from hyperexport.library.passes.fuse_values import annotated, constant_array
from hyperexport.library.passes.graph_probe import (
    POSITION_IDS,
    Unprobeable,
    ancestry,
    probe_session,
    subgraph,
)
from hyperexport.library.passes.ir_build import fresh_name
from hyperexport.library.passes.ort_kernels import GQA_INPUTS, MS_DOMAIN
from hyperexport.library.passes.rotary_in_attention import reads_batch_sequence_or_type

log = logging.getLogger(__name__)

_COS = GQA_INPUTS.index("cos_cache")
_SIN = GQA_INPUTS.index("sin_cache")
_POSITIONS = GQA_INPUTS.index("position_ids")


def probes(positions: int) -> tuple[np.ndarray, ...]:
    """The probe positions: a prompt, a left-padded batch (padding rows hold position 1, as
    transformers' ``cumsum - 1`` with ``masked_fill``), and the last position alone."""
    prompt = np.arange(min(8, positions))[None, :]
    padded = np.minimum(np.array([[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]]), positions - 1)
    return prompt, padded, np.array([[positions - 1]])


#: How far a probe's rows may be from the tables' (ONNX Runtime's vectorised ``Cos``/``Sin``
#: may differ by an ulp between a long tensor and a short one), in units of the dtype's epsilon.
_ULPS = 4


@dataclass(frozen=True)
class _Rotation:
    """A function whose attentions rotate by per-token rows of two of its inputs."""

    function: ir.Function
    cos: int
    sin: int
    attentions: tuple[ir.Node, ...]
    chains: frozenset[int]


class RotaryTablesPass(ir.passes.InPlacePass):
    """Constant rotary tables and ``position_ids`` for every function whose attentions rotate
    by per-token rows (module docstring).

    Args:
        positions: The tables' rows (the context length); 0 leaves the model as it is.
        record: The capture: which calls were made with ``position_ids``.
    """

    def __init__(self, positions: int, record: CaptureRecord) -> None:
        super().__init__()
        self.positions = positions
        self.record = record

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        position_ids = next((v for v in graph.inputs if v.name == POSITION_IDS), None)
        if self.positions <= 0 or position_ids is None:
            return ir.passes.PassResult(model, modified=False)
        if position_ids.dtype != ir.DataType.INT64:
            log.info(
                "rotary tables: %s is %s, not the kernel's int64: the rows stay per-token",
                POSITION_IDS,
                position_ids.dtype,
            )
            return ir.passes.PassResult(model, modified=False)
        # Nodes the earlier passes left unused may still read cos or sin: gone first.
        cleaned = RemoveUnusedNodesPass()(model).modified
        sites = call_sites(model)
        calls = self.record.children(None)
        tables: dict[tuple[int, int], tuple[ir.Value, ir.Value] | None] = {}
        rewired = []
        plans = []
        for ident, function in model.functions.items():
            rotation = _rotation(function)
            if rotation is None:
                continue
            nodes = sites[ident]
            why = _refusal(graph, function, nodes, calls)
            if why is None:
                pairs = {(id(n.inputs[rotation.cos]), id(n.inputs[rotation.sin])) for n in nodes}
                why = None if len(pairs) == 1 else "its calls pass different cos or sin"
            if why is not None:
                log.info("rotary tables: %s keeps its per-token rows: %s", function.name, why)
                continue
            plans.append((rotation, nodes))
        # Shapes inferred only where tables are to be made (the probes read the types).
        with annotated(model) if plans else contextlib.nullcontext():
            for rotation, nodes in plans:
                cos, sin = nodes[0].inputs[rotation.cos], nodes[0].inputs[rotation.sin]
                assert cos is not None and sin is not None  # read inputs are passed
                key = (id(cos), id(sin))
                if key not in tables:
                    tables[key] = self._tables(model, cos, sin, len(tables))
                made = tables[key]
                if made is not None:
                    rewired.append(
                        (rotation, nodes, made, _read_by_position(rotation, position_ids, made))
                    )
        if rewired:  # the rows' nodes go, and with them the last readers of cos and sin
            RemoveUnusedNodesPass()(model)
        for made in tables.values():  # registered now: the cleanup drops unread initializers
            for table in made or ():
                model.graph.register_initializer(table)
        for rotation, nodes, made, formals in rewired:
            _swap_inputs(rotation, nodes, formals, (position_ids, *made))
        done = len(rewired)
        if done:
            log.info(
                "rotary tables: %d functions read %d-row tables by position_ids",
                done,
                self.positions,
            )
        return ir.passes.PassResult(model, modified=bool(done) or cleaned)

    def _tables(
        self, model: ir.Model, cos: ir.Value, sin: ir.Value, index: int
    ) -> tuple[ir.Value, ir.Value] | None:
        """The tables as values for main-graph initializers (registered by the caller), or
        None (logged) where the probes refuse."""
        try:
            arrays = _evaluate(model, cos, sin, self.positions)
        except Unprobeable as e:
            log.info("rotary tables: %r and %r stay per-token rows: %s", cos.name, sin.name, e)
            return None
        made = []
        for role, array in zip(("cos", "sin"), arrays, strict=True):
            name = fresh_name(f"rotary_tables.{index}.{role}_cache", model.graph)
            # In the model file: the weights' data file stays the export's (model_file.py).
            tensor = keep_in_model_file(ir.tensor(array, name=name))
            value = ir.Value(
                name=name,
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(array.shape),
                const_value=tensor,
            )
            made.append(value)
        return made[0], made[1]


def _refusal(
    graph: ir.Graph, function: ir.Function, nodes: Sequence[ir.Node], calls: Sequence[ModuleCall]
) -> str | None:
    """Why a function and its calls cannot take ``position_ids`` and tables, or None."""
    if not nodes or any(n.graph is not graph for n in nodes):
        return "it is called from another function"
    if any(CHILD_INDEX not in n.meta for n in nodes):
        return "its calls are not tied to the captured module calls"
    if fresh_name(POSITION_IDS, function.graph) != POSITION_IDS:
        return f"it names a value {POSITION_IDS!r} already"
    for node in nodes:
        call = calls[node.meta[CHILD_INDEX]]
        if POSITION_IDS not in leaf_names(call.inputs):
            return f"{call.path} was not called with {POSITION_IDS}"
    return None


def _rotation(function: ir.Function) -> _Rotation | None:
    """The function's rotating attentions and the inputs their rows are cut from, where every
    other reader of those inputs reads their batch and sequence sizes or their type only."""
    attentions = [
        n
        for n in function
        if n.domain == MS_DOMAIN
        and n.op_type == ATTENTION_KERNEL
        and n.attributes.get_int("do_rotary", 0) == 1
    ]
    if not attentions:
        return None
    formals = {id(v): i for i, v in enumerate(function.inputs)}
    found: set[tuple[int, int]] = set()
    chains: set[int] = set()
    for attention in attentions:
        cos = _rows_of(attention.inputs[_COS], formals, chains)
        sin = _rows_of(attention.inputs[_SIN], formals, chains)
        if cos is None or sin is None or not _row_numbers(attention.inputs[_POSITIONS], chains):
            log.debug(
                "rotary tables: %s: %s reads no per-token rows", function.name, attention.name
            )
            return None
        found.add((cos, sin))
    if len(found) != 1:
        return None
    [(cos, sin)] = found
    for index in (cos, sin):
        for usage in function.inputs[index].uses():
            if id(usage.node) not in chains and not reads_batch_sequence_or_type(
                usage.node, usage.idx
            ):
                log.debug("rotary tables: %s: %s reads its rotary input", function.name, usage.node)
                return None
    return _Rotation(function, cos, sin, tuple(attentions), frozenset(chains))


def _rows_of(value: ir.Value | None, formals: dict[int, int], chain: set[int]) -> int | None:
    """The function input whose per-token rows ``value`` is (``Pad(Reshape(Slice(x, [0],
    [half], [-1]), [-1, half]))``, as ``fuse_rotary`` and ``rotary_in_attention`` write it)."""
    pad = value.producer() if value is not None else None
    reshape = _producer(pad, 0, "Pad", "Reshape")
    half = _producer(reshape, 0, "Reshape", "Slice")
    if half is None or reshape is None or len(half.inputs) < 4:
        return None
    starts, ends, axes = (constant_array(v) for v in half.inputs[1:4])
    width = constant_array(reshape.inputs[1])
    if starts is None or ends is None or axes is None or width is None:
        return None
    if list(starts.ravel()) != [0] or list(axes.ravel()) != [-1] or list(width.ravel())[:1] != [-1]:
        return None
    if list(ends.ravel()) != list(width.ravel())[1:]:
        return None
    source = half.inputs[0]
    if source is None or id(source) not in formals:
        return None
    chain.update(id(n) for n in (pad, reshape, half))
    return formals[id(source)]


def _row_numbers(value: ir.Value | None, chain: set[int]) -> bool:
    """Whether ``value`` is ``fuse_rotary``'s ``Reshape(Range(0, rows, 1), ...)``."""
    reshape = value.producer() if value is not None else None
    numbers = _producer(reshape, 0, "Reshape", "Range")
    if numbers is None or reshape is None:
        return False
    start, step = constant_array(numbers.inputs[0]), constant_array(numbers.inputs[2])
    if start is None or step is None or int(start) != 0 or int(step) != 1:
        return False
    assert reshape.graph is not None  # a node of the function's body
    chain.add(id(reshape))
    chain.update(ancestry(reshape.graph, [v for v in reshape.inputs if v is not None]))
    return True


def _producer(node: ir.Node | None, index: int, op_type: str, wanted: str) -> ir.Node | None:
    """The producer of ``node``'s input ``index`` if ``node`` is an ``op_type`` and the
    producer a ``wanted`` (default domain both), else None."""
    if not is_op(node, op_type):
        return None
    assert node is not None  # _is
    value = node.inputs[index] if index < len(node.inputs) else None
    producer = value.producer() if value is not None else None
    return producer if is_op(producer, wanted) else None


def _evaluate(model: ir.Model, cos: ir.Value, sin: ir.Value, positions: int) -> list[np.ndarray]:
    """The tables: the first halves of what the main graph's ``cos`` and ``sin`` give for
    positions ``0 .. positions - 1``, checked against every probe.

    Raises:
        Unprobeable: They read other inputs, are not per-position, or do not repeat halves.
    """
    probe = subgraph(model, [cos, sin], "rotary_tables_probe", unsized=(POSITION_IDS,))
    read = [name for name, _, _ in probe.inputs]
    if read != [POSITION_IDS]:
        raise Unprobeable(f"they are computed from {read}, not from {POSITION_IDS} alone")
    kind = probe.inputs[0][1]
    session = probe_session(probe.model)
    full = session.run(None, {POSITION_IDS: np.arange(positions, dtype=kind)[None, :]})
    for table in full:
        if table.ndim != 3 or table.shape[:2] != (1, positions) or table.shape[2] % 2:
            raise Unprobeable(f"they are {table.shape}, not (batch, seq, even head size)")
    half = full[0].shape[2] // 2
    for table in full:
        if not np.array_equal(table[..., :half], table[..., half:]):
            raise Unprobeable("their halves differ (no rotate-half tables)")
    for at in probes(positions):
        got = session.run(None, {POSITION_IDS: at.astype(kind)})
        for table, rows in zip(full, got, strict=True):
            expected = table[0][at]
            tolerance = _ULPS * float(np.finfo(table.dtype).eps)
            if rows.shape != expected.shape or not np.allclose(
                rows, expected, rtol=0, atol=tolerance
            ):
                raise Unprobeable(
                    f"at positions {at.tolist()} they are not the rows of positions "
                    f"0..{positions - 1} (a scaling by the sequence's length?)"
                )
    return [np.ascontiguousarray(table[0, :, :half]) for table in full]


def _read_by_position(
    rotation: _Rotation, position_ids: ir.Value, tables: tuple[ir.Value, ir.Value]
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Point the attentions at new function inputs: ``position_ids`` and the two tables; a
    size or type reader of ``cos`` or ``sin`` at ``position_ids`` or the cos table. The new
    inputs are typed and shaped as what the calls pass (``shared_sizes`` reads sizes off
    them)."""
    function = rotation.function
    positions = ir.Value(name=POSITION_IDS, type=position_ids.type, shape=position_ids.shape)
    cos_table, sin_table = (
        ir.Value(
            name=fresh_name(f"rotary_{role}_cache", function.graph),
            type=table.type,
            shape=table.shape,
        )
        for role, table in zip(("cos", "sin"), tables, strict=True)
    )
    for attention in rotation.attentions:
        attention.replace_input_with(_COS, cos_table)
        attention.replace_input_with(_SIN, sin_table)
        attention.replace_input_with(_POSITIONS, positions)
    for index in (rotation.cos, rotation.sin):
        for usage in list(function.inputs[index].uses()):
            if id(usage.node) not in rotation.chains:
                reader = positions if usage.node.op_type == "Shape" else cos_table
                usage.node.replace_input_with(usage.idx, reader)
    return positions, cos_table, sin_table


def _swap_inputs(
    rotation: _Rotation,
    nodes: Sequence[ir.Node],
    formals: tuple[ir.Value, ir.Value, ir.Value],
    arguments: tuple[ir.Value, ir.Value, ir.Value],
) -> None:
    """``cos`` and ``sin`` (unread now) out of the function and its calls; ``position_ids``
    in after the data inputs, the tables last (with the weights). ``formals`` and
    ``arguments``: the function's new inputs and what its calls pass them, in that order."""
    function = rotation.function
    inputs = function.inputs
    drop = sorted((rotation.cos, rotation.sin))
    if any(inputs[i].uses() for i in drop):
        raise AssertionError(f"{function.name}: cos or sin is still read")
    weights_from = _first_weight(inputs, nodes)
    for node in nodes:
        drop_inputs(node, drop)
    for index in reversed(drop):
        inputs.pop(index)
    at = weights_from - sum(1 for i in drop if i < weights_from)
    inputs.insert(at, formals[0])
    inputs.extend(formals[1:])
    for node in nodes:
        insert_input(node, at, arguments[0])
        for table in arguments[1:]:
            insert_input(node, len(node.inputs), table)


def _first_weight(inputs: Sequence[ir.Value], nodes: Sequence[ir.Node]) -> int:
    """The index from which every input is a main-graph initializer at every call."""
    at = len(inputs)
    while at > 0 and all((v := n.inputs[at - 1]) is not None and v.is_initializer() for n in nodes):
        at -= 1
    return at

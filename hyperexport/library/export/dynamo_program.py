"""The dynamo path (``dynamo=True``): placeholder op and the export call for one unit.

A placeholder is a ``torch.library`` custom op in the private namespace ``hyperexport_ph``. There
is one op per placeholder *signature* (number of inputs, shapes and dtypes of the outputs): its
fake implementation returns empty tensors of the captured output shapes, so ``torch.export``
traces through it without running the child module. The op also takes the placeholder's
``op_type`` (``P3``) as a string argument, and its ONNX translation (``custom_translation_table``)
emits one node ``hyperexport.placeholder::<op_type>`` with the op's tensor inputs and outputs.

Ops are defined on first use and kept for the life of the process: their names are derived from
the signature, so defining is idempotent, and repeated exports in one process reuse them.

A *derived* output dimension (None in the signature: a strided conv's output length, H/2) is
computed by the child's own forward run on the op's inputs (:func:`derived_shapes`): under the
fake mode of ``torch.export`` that gives a symbolic expression of the input sizes (``(s0 - 10)
// 5 + 1``), so the parent's graph computes it as torch would. The shape functions live in a
per-thread registry, keyed by ``op_type``, for the duration of one :func:`export_program`
(``torch.onnx.export`` traces the program again, calling the fake kernel again).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx_ir as ir
import torch
from onnx_ir.passes.common import InlinePass

from hyperexport.base.contracts.manifest import PLACEHOLDER_DOMAIN
from hyperexport.base.errors import InputError
from hyperexport.base.versions import onnxscript_rolls_negative_dims_wrong
from hyperexport.library.capture.torch_hooks import torch_dtype, torch_dtype_name
from hyperexport.library.export.placeholders import Dim, PlaceholderSpec, ShapeFunction
from hyperexport.library.export.torch_exporter import (
    decomposition_without_input_guards,
    dynamo_export_caches,
)

log = logging.getLogger(__name__)

#: The torch.library namespace of placeholder ops (private to hyperexport).
NAMESPACE = "hyperexport_ph"

#: Every ONNX tensor type, for the placeholder schema's type constraints.
_ANY_TENSOR = tuple(
    t
    for t in onnx.defs.get_schema("Identity", 21).type_constraints[0].allowed_type_strs
    if t.startswith("tensor(")
)


@dataclass(frozen=True)
class _OpSignature:
    """What decides a placeholder op: its input count and its outputs' shapes and dtypes.

    A shape entry is a fixed size, or ``(input index, input axis)`` for a dynamic dimension
    that the op computes from that input's size.
    """

    num_inputs: int
    outputs: tuple[tuple[tuple[Dim, ...], str], ...]

    @property
    def op_name(self) -> str:
        text = json.dumps([self.num_inputs, self.outputs], sort_keys=True)
        return f"ph_{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def _sizes(
    shapes: Sequence[tuple[Dim, ...]], inputs: Sequence[torch.Tensor], op_type: str
) -> list[list[Any]]:
    """Each output's sizes: fixed, read off an input, or (None) from the child's shapes."""
    derived = None
    if any(d is None for shape in shapes for d in shape):
        derived = _derived_function(op_type)(inputs)
    return [
        [
            d
            if isinstance(d, int)
            else derived[index][axis]  # type: ignore[index]
            if d is None
            else inputs[d[0]].shape[d[1]]
            for axis, d in enumerate(shape)
        ]
        for index, shape in enumerate(shapes)
    ]


_DERIVED = threading.local()


def _derived_function(op_type: str) -> ShapeFunction:
    table: dict[str, ShapeFunction] | None = getattr(_DERIVED, "table", None)
    function = table.get(op_type) if table is not None else None
    if function is None:
        raise RuntimeError(
            f"placeholder {op_type} has a derived output dimension but no shape function "
            "(it ran outside derived_shapes)"
        )
    return function


@contextlib.contextmanager
def derived_shapes() -> Iterator[None]:
    """Hold the shape functions of derived output dimensions registered while open (per thread)."""
    previous = getattr(_DERIVED, "table", None)
    _DERIVED.table = {}
    try:
        yield
    finally:
        _DERIVED.table = previous


@dataclass
class _PlaceholderOp:
    """A defined custom op and its ONNX translation."""

    overload: Callable[..., Any]
    translation: Callable[..., Any]


_LOCK = threading.Lock()
_LIBRARY: torch.library.Library | None = None
_OPS: dict[str, _PlaceholderOp] = {}


def _library() -> torch.library.Library:
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
    return _LIBRARY


def _signature_of(
    num_inputs: int, outputs: Sequence[torch.Tensor], output_dims: Sequence[tuple[Dim, ...]]
) -> _OpSignature:
    shapes = output_dims or [tuple(int(d) for d in t.shape) for t in outputs]
    return _OpSignature(
        num_inputs,
        tuple((tuple(shape), torch_dtype_name(t.dtype)) for shape, t in zip(shapes, outputs)),
    )


def _define(sig: _OpSignature) -> _PlaceholderOp:
    """Define (once per process) the custom op for ``sig``, its fake kernel and translation."""
    name = sig.op_name
    with _LOCK:
        op = _OPS.get(name)
        if op is not None:
            return op
        lib = _library()
        lib.define(f"{name}(Tensor[] inputs, str op_type) -> Tensor[]")
        shapes = [shape for shape, _ in sig.outputs]
        dtypes = [torch_dtype(dtype) for _, dtype in sig.outputs]

        def kernel(inputs: list[torch.Tensor], op_type: str) -> list[torch.Tensor]:
            device = inputs[0].device if inputs else torch.device("cpu")
            sizes = _sizes(shapes, inputs, op_type)
            return [torch.zeros(s, dtype=t, device=device) for s, t in zip(sizes, dtypes)]

        def fake(inputs: list[torch.Tensor], op_type: str) -> list[torch.Tensor]:
            device = inputs[0].device if inputs else torch.device("cpu")
            sizes = _sizes(shapes, inputs, op_type)
            return [torch.empty(s, dtype=t, device=device) for s, t in zip(sizes, dtypes)]

        lib.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        overload = getattr(getattr(torch.ops, NAMESPACE), name).default
        op = _PlaceholderOp(overload, _translation(sig))
        _OPS[name] = op
        log.debug("defined placeholder op %s::%s", NAMESPACE, name)
        return op


def _translation(sig: _OpSignature) -> Callable[..., Any]:
    """The ONNX translation of a placeholder op: one node ``hyperexport.placeholder::<op_type>``."""
    num_outputs = len(sig.outputs)

    def translate(inputs: Sequence[Any], op_type: str) -> Any:
        schema = onnx.defs.OpSchema(
            op_type,
            PLACEHOLDER_DOMAIN,
            1,
            inputs=[
                onnx.defs.OpSchema.FormalParameter(f"input_{i}", f"T{i}")
                for i in range(len(inputs))
            ],
            outputs=[
                onnx.defs.OpSchema.FormalParameter(f"output_{i}", f"U{i}")
                for i in range(num_outputs)
            ],
            type_constraints=[(f"T{i}", _ANY_TENSOR, "") for i in range(len(inputs))]
            + [(f"U{i}", _ANY_TENSOR, "") for i in range(num_outputs)],
        )
        # Imported here, not with the module: torch's dynamo exporter has imported it by now,
        # and a TorchScript-only process never pays for it (about 24 MB of RSS).
        import onnxscript

        opset = onnxscript.values.Opset(PLACEHOLDER_DOMAIN, 1)
        result = onnxscript.values.Op(opset, op_type, schema)(*inputs)
        return list(result) if isinstance(result, Sequence) else [result]

    return translate


def apply_placeholder(
    op_type: str,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    output_dims: Sequence[tuple[Dim, ...]] = (),
    derived: ShapeFunction | None = None,
) -> Sequence[torch.Tensor]:
    """Call the placeholder custom op of this signature (defined on first use).

    ``outputs`` gives the captured shapes and dtypes; the op returns tensors like them (empty
    under ``torch.export``'s fake mode). With ``output_dims``, dynamic output sizes are read
    from the inputs' (symbolic) sizes, so dynamic dimensions flow through the placeholder; a
    derived one (None) from ``derived``, registered for ``op_type`` inside
    :func:`derived_shapes`.
    """
    if derived is not None:
        table: dict[str, ShapeFunction] | None = getattr(_DERIVED, "table", None)
        if table is None:
            raise RuntimeError(f"placeholder {op_type}: derived shapes outside derived_shapes()")
        table[op_type] = derived
    op = _define(_signature_of(len(inputs), outputs, output_dims))
    return tuple(op.overload(list(inputs), op_type))


def export_program(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Any,
    opset: int,
    translations: Mapping[Any, Any] | None,
) -> ir.Model:
    """``torch.export`` (non-strict) then ``torch.onnx.export(dynamo=True)``, into onnx_ir.

    The program is captured first, so that every placeholder op it calls is defined by the time
    its translation table is built. torch's optimizer is off: it would fold and rename
    initializers, and our own pass pipeline optimizes the composed model.
    """
    with derived_shapes():
        return _export_program(module, inputs, dynamic_shapes, opset, translations)


def _export_program(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    dynamic_shapes: Any,
    opset: int,
    translations: Mapping[Any, Any] | None,
) -> ir.Model:
    with quiet_exporter(), torch.no_grad():
        program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes, strict=False)
    if onnxscript_rolls_negative_dims_wrong():
        _roll_dims_made_non_negative(program)
    table = placeholder_translation_table(program)
    table.update(translations or {})
    # torch.onnx's decompositions under no_grad too: with autograd on, 5.x Swin's view of SDPA's
    # transposed output at a symbolic batch fails there ("Cannot view ... [4*s39, 16, 2, 8]").
    with (
        quiet_exporter(),
        torch.no_grad(),
        dynamo_export_caches(),
        decomposition_without_input_guards(),
    ):
        onnx_program = torch.onnx.export(
            program,
            inputs,
            dynamo=True,
            verbose=False,
            opset_version=opset,
            custom_translation_table=table,
            optimize=False,
            external_data=False,
        )
    if onnx_program is None:  # only the TorchScript path returns None
        raise RuntimeError("torch.onnx.export(dynamo=True) returned no program")
    return _inline_library_functions(onnx_program.model)


def _roll_dims_made_non_negative(program: torch.export.ExportedProgram) -> None:
    """Each ``aten.roll`` of ``program`` given its dims as non-negative ones, in place.

    The onnxscript releases of ``versions.ONNXSCRIPT_ROLLS_NEGATIVE_DIMS_WRONG`` translate a roll
    along a negative dim into a model ONNX Runtime refuses; the same roll along ``rank + dim``
    is the same function and translates right.
    """
    changed = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.roll.default:
            continue
        value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        by_keyword = "dims" in node.kwargs
        dims = node.kwargs["dims"] if by_keyword else node.args[2] if len(node.args) > 2 else []
        if value is None or not any(dim < 0 for dim in dims):
            continue
        positive = [dim % value.dim() for dim in dims]
        if by_keyword:
            node.update_kwarg("dims", positive)
        else:
            node.update_arg(2, positive)
        changed += 1
    if changed:
        log.debug("aten.roll: %d negative dims made non-negative for onnxscript", changed)
        program.graph_module.recompile()


def _inline_library_functions(model: ir.Model) -> ir.Model:
    """``model`` with the functions torch's exporter left in it inlined.

    With the optimizer off, some onnxscript releases (0.6.2 on torch 2.13: ``aten_split``,
    ``aten_getitem`` of ``pkg.onnxscript.torch_lib``) leave library functions in the exported
    model. A unit's functions would not survive the splice into the parent (only hierarchy
    functions are carried), so they are inlined here; a unit holds no function of ours.
    """
    if model.functions:
        log.debug("inlining %s left by torch's exporter", sorted(model.functions))
        InlinePass()(model)
    return model


def export_dynamo(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    *,
    opset: int,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: Mapping[str, Mapping[int, str]] | None,
    specs: Sequence[PlaceholderSpec],
    translations: Mapping[Any, Any] | None = None,
) -> ir.Model:
    """``torch.export`` then ``torch.onnx.export(..., dynamo=True)`` of one unit.

    The program is captured first (non-strict), so that every placeholder op it calls is
    defined by the time its translation table is built. torch's optimizer is off: it would fold
    and rename initializers, and our own pass pipeline optimizes the composed model.

    Its graph inputs and outputs are named ``input_names``/``output_names`` and its initializers
    by state-dict name (``inner.<...>``); initializers are references to the module's tensors.
    """
    started = time.perf_counter()
    input_axes = {k: v for k, v in (dynamic_axes or {}).items() if k in input_names}
    dynamic_shapes = to_dynamic_shapes(inputs, input_names, input_axes)
    model = export_program(module, inputs, dynamic_shapes, opset, translations)
    name_graph_values(model.graph, input_names, output_names)
    name_dynamic_dims(model.graph, input_names, input_axes)
    _name_initializers(model.graph, module)
    log.debug("dynamo export: %d placeholders, %.2fs", len(specs), time.perf_counter() - started)
    return model


def placeholder_translation_table(program: torch.export.ExportedProgram) -> dict[Any, Any]:
    """The ``custom_translation_table`` entries of the placeholder ops that ``program`` calls."""
    translations = {op.overload: op.translation for op in _OPS.values()}
    return {
        node.target: translations[node.target]
        for node in program.graph.nodes
        if node.op == "call_function" and node.target in translations
    }


#: The logger of torch.onnx's op registry (a logger name only; nothing is imported from it).
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"


class _DropTorchvisionNotice(logging.Filter):
    """Drops torch.onnx's "torchvision is not installed" notice, logged on every export."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torchvision is not installed" not in record.getMessage()


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the per-call notices of torch.export and torch.onnx for the duration.

    A hierarchical export makes one call per unit, so each notice would repeat per module.
    """
    notice = _DropTorchvisionNotice()
    logger = logging.getLogger(_REGISTRATION_LOGGER)
    logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx.*")
            yield
    finally:
        logger.removeFilter(notice)


def to_dynamic_shapes(
    inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]] | None,
) -> tuple[dict[int, Any] | None, ...] | None:
    """``dynamic_axes`` (by input name) as ``torch.export`` dynamic shapes (by position).

    Every dynamic axis is ``Dim.AUTO``: torch.export then works out how the dimensions relate
    (a mask of ``past_len + new_len`` positions, say) instead of refusing names it was not told
    the relation of. A dimension it had to specialise instead is caught after the export
    (:func:`name_dynamic_dims`), never silently kept static.
    """
    if not dynamic_axes:
        return None
    unknown = sorted(set(dynamic_axes) - set(input_names))
    if unknown:
        raise InputError(f"dynamic_axes {unknown}", f"not among the inputs {list(input_names)}")
    dims: dict[str, Any] = {}
    shapes: list[dict[int, Any] | None] = []
    for name, tensor in zip(input_names, inputs):
        axes = dynamic_axes.get(name)
        if not axes:
            shapes.append(None)
            continue
        shapes.append(
            {
                axis % tensor.dim(): dims.setdefault(dim, torch.export.Dim.AUTO)
                for axis, dim in axes.items()
            }
        )
    return (tuple(shapes),)  # type: ignore[return-value]


def name_graph_values(
    graph: ir.Graph, input_names: Sequence[str], output_names: Sequence[str]
) -> None:
    """Name the graph's inputs and outputs as asked.

    An output that is also a graph input, an initializer or another output gets an Identity
    node of its own first, so that every graph value keeps one name.
    """
    if len(graph.inputs) != len(input_names) or len(graph.outputs) != len(output_names):
        raise RuntimeError(
            f"the exported graph has {len(graph.inputs)} inputs and {len(graph.outputs)} "
            f"outputs, expected {len(input_names)} and {len(output_names)}"
        )
    for value, name in zip(graph.inputs, input_names):
        _free_name(graph, name, value)
        value.name = name
    seen: set[int] = set()
    for i, (value, name) in enumerate(zip(list(graph.outputs), output_names)):
        if id(value) in seen or value.is_graph_input() or value.is_initializer():
            node = ir.node("Identity", [value], name=f"{name}/Identity")
            graph.append(node)
            out = node.outputs[0]
            out.type, out.shape = value.type, value.shape
            graph.outputs[i] = out
            value = out
        seen.add(id(value))
        _free_name(graph, name, value)
        value.name = name


def _free_name(graph: ir.Graph, name: str, owner: ir.Value) -> None:
    """Rename a value other than ``owner`` that already carries ``name`` (a torch-made name)."""
    clashing = [v for node in graph for v in node.outputs if v.name == name and v is not owner]
    if not clashing:
        return
    taken = {v.name for node in graph for v in node.outputs}
    taken.update(v.name for v in (*graph.inputs, *graph.initializers.values()))
    suffix = 0
    for value in clashing:  # numbered in graph order: the same names in every process
        while f"{name}__{suffix}" in taken:
            suffix += 1
        value.name = f"{name}__{suffix}"
        taken.add(value.name)


def _name_initializers(graph: ir.Graph, module: torch.nn.Module) -> None:
    """Name each weight initializer by the first state-dict name of its tensor.

    ``torch.export`` may name a weight by any of its aliases (a module registered twice, as the
    unit wrapper registers the exported module; tied weights), where the TorchScript path and
    the compose pass use the first name in registration order.
    """
    canonical: dict[int, str] = {}
    aliases: dict[str, str] = {}
    named = [
        *module.named_parameters(remove_duplicate=False),
        *module.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        aliases[name] = canonical.setdefault(id(tensor), name)
    for value in list(graph.initializers.values()):
        target = aliases.get(value.name or "")
        if target is None or target == value.name:
            continue
        if target in graph.initializers:
            value.replace_all_uses_with(graph.initializers[target])
            graph.initializers.pop(value.name)  # type: ignore[arg-type]
            continue
        graph.initializers.pop(value.name)  # type: ignore[arg-type]
        value.name = target
        graph.initializers[target] = value


def name_dynamic_dims(
    graph: ir.Graph,
    input_names: Sequence[str],
    dynamic_axes: Mapping[str, Mapping[int, str]] | None,
) -> None:
    """Give the symbolic dims torch made for ``dynamic_axes`` the names the user asked for."""
    if not dynamic_axes:
        return
    names: dict[str, str] = {}
    for value in graph.inputs:
        axes = dynamic_axes.get(value.name or "", {})
        if value.shape is None:
            continue
        for axis, name in axes.items():
            dim = value.shape[axis % len(value.shape)]
            if isinstance(dim, int):
                raise InputError(
                    f"dynamic_axes[{value.name!r}][{axis}]",
                    f"torch.export specialised dimension {name!r} to {dim} (a traced size of 1, "
                    "or a size the model's code fixes); trace with another size, or keep the "
                    "dimension static",
                )
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                names[dim.value] = name
    values = [*graph.inputs, *graph.outputs, *(v for node in graph for v in node.outputs)]
    for value in values:
        if value.shape is None:
            continue
        dims = [
            ir.SymbolicDim(_renamed(d.value, names))
            if isinstance(d, ir.SymbolicDim) and d.value is not None
            else d
            for d in value.shape
        ]
        value.shape = ir.Shape(dims)


#: A torch symbol inside a dimension expression (``s36`` in ``((s36//20)) - 1``).
_SYMBOL = re.compile(r"\b[su]\d+\b")


def _renamed(value: str, names: Mapping[str, str]) -> str:
    """``value`` with torch's symbols named: a whole symbol, or each inside an expression (a
    derived dimension such as a conv output length reads ``((samples//20)) - 1``)."""
    if value in names:
        return names[value]
    return _SYMBOL.sub(lambda m: names.get(m.group(0), m.group(0)), value)

"""Patches of torch's ONNX exporters, used while hyperexport exports its units: the dynamo
exporter's per-call caches and its decomposition guards, the TorchScript exporter's symbolic
output types and shape inference (private APIs, restored on exit; whether a release needs a
patch is a version fact, :mod:`hyperexport.base.versions`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from hyperexport.base.versions import (
    export_guards_name_dynamo_sources,
    sdpa_symbolic_leaves_masked_rows_nan,
    sdpa_symbolic_reads_scale_as_float,
    torchlib_registry_takes_opset,
    torchscript_where_keeps_double_scalars,
)

if TYPE_CHECKING:
    import torch


def set_symbolic_output_type(value: object, like: torch.Tensor, sizes: list[int | None]) -> None:
    """Give a TorchScript symbolic output the dtype of ``like`` and ``sizes`` (None: unknown).

    Without it, the TorchScript exporter warns for every custom op and loses the shape
    information that later symbolics (e.g. Linear -> Gemm vs MatMul) decide on.
    """
    import torch

    tensor_type = torch._C.TensorType.create_from_tensor(like).with_sizes(sizes)
    value.setType(tensor_type)  # type: ignore[attr-defined]


#: torch.onnx's dynamo registries by opset, built once per process (see dynamo_export_caches).
_ONNX_REGISTRIES: dict[int | None, object] = {}
#: torch.export's set of CompositeImplicitAutograd ops, keyed by the op namespaces it covered.
_CIA_OPS: dict[frozenset[str], object] = {}


@contextlib.contextmanager
def dynamo_export_caches() -> Iterator[None]:
    """Let ``torch.onnx.export(dynamo=True)`` reuse what it rebuilds on every call, while open.

    A hierarchical export makes one call per unit, and two per-call costs of torch 2.13 would
    make most of its overhead over a plain export:

    * the registry of torchlib translations (about a second: it parses the source of every
      torchlib function), kept per opset;
    * the set of CompositeImplicitAutograd ops that ``run_decompositions`` preserves (about
      0.2 s: it walks every op of every namespace), kept per set of op namespaces. An op of an
      existing namespace registered after the first export is not seen until the process
      restarts.

    Both are built on first use and kept for the process; only calls inside this context see
    them. Translations passed in ``custom_translation_table`` are registered into the shared
    registry and stay there: callers must only pass ops whose translation never changes
    (hyperexport's placeholder ops, which are themselves defined once per process).
    """
    import torch
    from torch.export import exported_program
    from torch.onnx._internal.exporter import _registration

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    collect = exported_program._collect_all_valid_cia_ops
    if torchlib_registry_takes_opset():
        default_opset = original.__func__.__defaults__[0]

        def from_torchlib(cls: type, opset_version: int = default_opset) -> object:
            if opset_version not in _ONNX_REGISTRIES:
                _ONNX_REGISTRIES[opset_version] = original.__func__(
                    cls, opset_version=opset_version
                )
            return _ONNX_REGISTRIES[opset_version]

    else:  # torch 2.6: one registry, at its own opset (versions.TORCHLIB_REGISTRY_TAKES_OPSET)

        def from_torchlib(cls: type) -> object:  # type: ignore[misc]
            if None not in _ONNX_REGISTRIES:
                _ONNX_REGISTRIES[None] = original.__func__(cls)
            return _ONNX_REGISTRIES[None]

    def collect_cia_ops() -> object:
        key = frozenset(torch.ops._dir)
        if key not in _CIA_OPS:
            _CIA_OPS[key] = collect()
        return _CIA_OPS[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)  # type: ignore[method-assign,assignment]
    exported_program._collect_all_valid_cia_ops = collect_cia_ops  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        _registration.ONNXRegistry.from_torchlib = original  # type: ignore[method-assign]
        exported_program._collect_all_valid_cia_ops = collect  # type: ignore[attr-defined]


@contextlib.contextmanager
def decomposition_without_input_guards() -> Iterator[None]:
    """Let ``run_decompositions`` unlift a program with dynamic shapes on torch 2.9.

    torch 2.9's ``ExportedProgram.module()`` inserts a ``_guards_fn`` whose generated code names
    dynamo's ``L[...]`` sources, and ``torch.onnx.export(dynamo=True)`` calls it while it
    decomposes: ``NameError: name 'L' is not defined`` (pytorch/pytorch#172903); later releases
    rewrite those names to the signature's
    (:func:`~hyperexport.base.versions.export_guards_name_dynamo_sources`). The guards only check a
    call's inputs and never reach the ONNX graph, so while open, and only where that rewrite is
    missing, ``module()`` is built without them.
    """
    from torch.export.exported_program import ExportedProgram

    if not export_guards_name_dynamo_sources():
        yield
        return
    original = ExportedProgram.module

    def module(self: ExportedProgram, check_guards: bool = False) -> Any:
        return original(self, check_guards=check_guards)

    ExportedProgram.module = module  # type: ignore[method-assign]
    try:
        yield
    finally:
        ExportedProgram.module = original  # type: ignore[method-assign]


#: Weights at least this large are kept out of the TorchScript exporter's shape inference.
_SHAPE_INFERENCE_VALUE_LIMIT = 1 << 20


@contextlib.contextmanager
def weights_out_of_shape_inference() -> Iterator[None]:
    """Keep large weights' values out of the TorchScript exporter's ONNX shape inference.

    ``_jit_pass_onnx_graph_shape_type_inference`` copies every parameter value it is given
    into the protobuf of each node that reads it (the embedding table into its Gather node),
    twice per export: a transient copy of the largest weights. Shape inference needs values
    only for shape-like constants, never for weights (their shapes and types are on the graph),
    so tensors of at least 1 MiB are left out of the dict it sees. Restored on exit.
    """
    import torch

    original = torch._C._jit_pass_onnx_graph_shape_type_inference

    def infer(graph: Any, params_dict: dict[str, Any], opset: int) -> None:
        small = {
            k: v
            for k, v in params_dict.items()
            if not isinstance(v, torch.Tensor)
            or v.numel() * v.element_size() < _SHAPE_INFERENCE_VALUE_LIMIT
        }
        original(graph, small, opset)

    torch._C._jit_pass_onnx_graph_shape_type_inference = infer  # type: ignore[assignment]
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original


#: The aten op whose TorchScript symbolic :func:`repaired_sdpa_symbolic` wraps.
SDPA_OP = "aten::scaled_dot_product_attention"
#: The opset torch registers that symbolic at (it serves every export opset from there on).
_SDPA_SYMBOLIC_OPSET = 14


@contextlib.contextmanager
def repaired_sdpa_symbolic() -> Iterator[None]:
    """torch's own TorchScript SDPA symbolic, with three repairs; restored on exit.

    * **The output in the query's dtype** (bfloat16, float16): torch's symbolic turns a boolean
      mask into an additive one with float32 constants; the exporter's type promotion then casts
      the scores, the values and the result to float32, so a bfloat16 attention returns float32
      where torch returns bfloat16. Everything after it (the output projection, the residual
      ``Add``) follows in float32 and the unit's graph ends in a float32 value declared bfloat16:
      ``onnx.checker`` refuses the model ("Inferred elem type differs"). The symbolic's output
      gets one ``Cast`` to the query's dtype when that dtype is a 16-bit float; float32 graphs
      are exported unchanged.
    * **A given ``scale`` as a value of the query's dtype**, for a 16-bit query on every release
      and for any query on
      :func:`~hyperexport.base.versions.sdpa_symbolic_reads_scale_as_float` releases: the
      constant is given as a ``Cast`` to the query's dtype (a value the symbolic keeps as it
      is). Those releases' symbolic turns a constant ``scale`` into a Python float and then uses
      it as a node input, which fails. Given the constant as it is (a double), the symbolic
      multiplies the 16-bit query by its square root, and the exporter's type promotion casts
      that double with ``to=15``, torch's number for bfloat16 but ONNX's for complex128: torch
      2.5's shape inference refuses it ("ScalarType ComplexDouble is an unexpected tensor scalar
      type"), later ones fold it with a warning ("Casting complex values to real").
    * **Zeros for a fully masked row** on
      :func:`~hyperexport.base.versions.sdpa_symbolic_leaves_masked_rows_nan` releases: given a
      boolean mask, a query row that may attend to no key (a left-padded position) gets the
      ``Softmax`` of a row of ``-inf``, NaN in ONNX Runtime, where torch's SDPA returns zeros;
      the NaN then reaches every later layer through the padded positions' keys and values. The
      output of such a row is set to zero (``Where`` on "no key attended", from the mask), which
      is what torch returns and what later releases' symbolic exports. Rows that attend to a key
      are unchanged.
    """
    import onnx
    import torch
    from torch.onnx import symbolic_helper, symbolic_opset14  # type: ignore[attr-defined]

    scale_as_value = sdpa_symbolic_reads_scale_as_float()
    zero_masked_rows = sdpa_symbolic_leaves_masked_rows_nan()
    # TorchScript's scalar type names of the 16-bit floats, and their ONNX numbers.
    low_precision = {"BFloat16": onnx.TensorProto.BFLOAT16, "Half": onnx.TensorProto.FLOAT16}

    def symbolic(g: Any, query: Any, key: Any, value: Any, *rest: Any) -> Any:
        arguments = list(rest)
        scale = arguments[3] if len(arguments) > 3 else None
        to = low_precision.get(query.type().scalarType())
        given_scale = scale is not None and not symbolic_helper._is_none(scale)
        if given_scale and (scale_as_value or to is not None):
            given = symbolic_helper._maybe_get_const(scale, "f")
            if isinstance(given, float):
                constant = g.op("Constant", value_t=torch.tensor(given, dtype=torch.float64))
                arguments[3] = g.op("Cast", constant, to_i=to or _onnx_type(query))
        output = symbolic_opset14.scaled_dot_product_attention(g, query, key, value, *arguments)
        if to is not None:
            output = g.op("Cast", output, to_i=to)
        mask = arguments[0] if arguments else None
        if zero_masked_rows and _is_boolean(mask):
            output = _zero_where_no_key_attended(g, mask, query, output)
        return output

    def _is_boolean(mask: Any) -> bool:
        if mask is None or symbolic_helper._is_none(mask):
            return False
        return bool(mask.type().scalarType() == "Bool")

    torch.onnx.register_custom_op_symbolic(SDPA_OP, symbolic, _SDPA_SYMBOLIC_OPSET)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic(SDPA_OP, _SDPA_SYMBOLIC_OPSET)


#: The aten op whose TorchScript symbolics :func:`repaired_where_symbolic` wraps.
WHERE_OP = "aten::where"


@contextlib.contextmanager
def repaired_where_symbolic() -> Iterator[None]:
    """torch's own TorchScript ``where`` symbolic, whose two branches get one element type, on
    the releases of :func:`~hyperexport.base.versions.torchscript_where_keeps_double_scalars`;
    nothing elsewhere.

    There, a Python scalar branch (``torch.where(mask, torch.finfo(x.dtype).min, x)``) reaches
    ONNX as a double constant beside the tensor, and ``Where`` refuses two types. The constant
    branch is cast to the other branch's type, which is what torch computes; two branches of one
    type are exported unchanged.
    """
    import torch
    from torch.onnx import symbolic_opset9, symbolic_opset13  # type: ignore[attr-defined]

    if not torchscript_where_keeps_double_scalars():
        yield
        return

    def repaired(original: Callable[..., Any]) -> Callable[..., Any]:
        def symbolic(
            g: Any, condition: Any, self: Any = None, other: Any = None, *rest: Any
        ) -> Any:
            if self is not None and other is not None:
                self_type, other_type = self.type().scalarType(), other.type().scalarType()
                if None not in (self_type, other_type) and self_type != other_type:
                    if _is_constant(self):
                        self = g.op("Cast", self, to_i=_onnx_type(other))
                    elif _is_constant(other):
                        other = g.op("Cast", other, to_i=_onnx_type(self))
            return original(g, condition, self, other, *rest)

        return symbolic

    # torch registers where at opsets 9 and 13; each export opset takes the closest below it
    originals = {9: symbolic_opset9.where, 13: symbolic_opset13.where}
    for opset, original in originals.items():
        torch.onnx.register_custom_op_symbolic(WHERE_OP, repaired(original), opset)
    try:
        yield
    finally:
        for opset in originals:
            torch.onnx.unregister_custom_op_symbolic(WHERE_OP, opset)


def _is_constant(value: Any) -> bool:
    """Whether a TorchScript value is a constant (a Python scalar the trace recorded)."""
    return bool(value.node().kind() in ("onnx::Constant", "prim::Constant"))


def _onnx_type(value: Any) -> int:
    """The ONNX element type of a TorchScript value (torch's private type table)."""
    from torch.onnx._type_utils import JitScalarType  # type: ignore[import-not-found]

    return int(JitScalarType.from_value(value).onnx_type())


#: The opset from which ONNX's reductions take their axes as an input instead of an attribute.
_REDUCE_AXES_AS_INPUT_FROM = 18


def _zero_where_no_key_attended(g: Any, mask: Any, query: Any, output: Any) -> Any:
    """``output`` with zeros on every query row whose boolean ``mask`` row attends to no key
    (see :func:`repaired_sdpa_symbolic`); the zero in the query's dtype, which ``output`` has."""
    import onnx
    import torch
    from torch.onnx._type_utils import JitScalarType  # type: ignore[import-not-found]

    attended = g.op("Cast", mask, to_i=onnx.TensorProto.FLOAT)
    if g.opset >= _REDUCE_AXES_AS_INPUT_FROM:
        last_axis = g.op("Constant", value_t=torch.tensor([-1], dtype=torch.int64))
        any_key = g.op("ReduceMax", attended, last_axis, keepdims_i=1)
    else:
        any_key = g.op("ReduceMax", attended, axes_i=[-1], keepdims_i=1)
    no_key = g.op("Not", g.op("Cast", any_key, to_i=onnx.TensorProto.BOOL))
    zero = g.op("Constant", value_t=torch.zeros((), dtype=JitScalarType.from_value(query).dtype()))
    return g.op("Where", no_key, zero, output)

"""The frozen options objects of the library API, validated where they are defined.

Everything beyond HyperONNX's flat signature goes into :class:`ExportOptions`, not into new
keyword flags. :class:`ExportRequest` holds ``export_hyper_onnx``'s own flat arguments once they
are checked. Every check raises :class:`~hyperexport.base.errors.OptionsError` naming the option; no
torch import here (the package import stays cheap).
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from hyperexport.base.contracts.names import BUILTIN_ATTENTION, OPSET_RANGES
from hyperexport.base.errors import OpsetError, OptionsError

FunctionMode = Literal["per_instance", "per_type"]
FUNCTION_MODES: tuple[str, ...] = get_args(FunctionMode)
#: One function per module instance (and input signature): the default.
PER_INSTANCE: FunctionMode = "per_instance"
#: One function per class whose calls export the same graph (weights become inputs).
PER_TYPE: FunctionMode = "per_type"
#: ``RewriteOptions.fuse``: no fusion; ONNX's own fused ops (opset 24, portable); ONNX Runtime's
#: contrib kernels (``com.microsoft``, runs in ONNX Runtime only). ``passes/fuse_ops.py``.
Fusion = Literal["none", "standard", "onnxruntime"]
FUSIONS: tuple[str, ...] = get_args(Fusion)

AxesItems = tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
ShapeItems = tuple[tuple[str, tuple[int, ...]], ...]


def _require_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise OptionsError(f"{owner}.{name}", f"must be True or False, got {value!r}")


def _require_int(where: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(where, f"must be an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise OptionsError(where, f"must be in {span}, got {value}")


@dataclass(frozen=True)
class CustomOpSymbolic:
    """A user symbolic for the TorchScript path: ``register_custom_op_symbolic(name, fn, opset)``.

    Attributes:
        name: The aten-style qualified op name, ``"domain::op"``.
        symbolic: Import path of the symbolic function, ``"package.module:function"``.
        opset: The opset version the symbolic is registered for.
    """

    name: str
    symbolic: str
    opset: int

    def __post_init__(self) -> None:
        domain, sep, op = self.name.partition("::") if isinstance(self.name, str) else ("", "", "")
        if not (sep and domain and op):
            raise OptionsError("CustomOpSymbolic.name", f"must be 'domain::op', got {self.name!r}")
        module, sep, function = (
            self.symbolic.partition(":") if isinstance(self.symbolic, str) else ("", "", "")
        )
        if not (sep and module and function):
            raise OptionsError(
                "CustomOpSymbolic.symbolic",
                f"must be 'package.module:function', got {self.symbolic!r}",
            )
        _require_int("CustomOpSymbolic.opset", self.opset, 1)


@dataclass(frozen=True)
class RewriteOptions:
    """Which rewrite passes run after the functions are composed.

    Attributes:
        fold_leftovers: Fold the top-level nodes between function calls into functions of their own.
        fuse_constants: Move constants fed to a function call into the function body (off by
            default: it freezes values such as masks and position embeddings at the traced shape).
        optimize: Run onnxscript's optimizer with functions kept (not inlined). Off by default:
            on a 4-layer tiny Llama it costs several times the export itself.
        weights_as_initializers: Every MatMul weight becomes a main-graph initializer in the
            layout MatMul reads (``passes/weights_as_initializers.py``), passed to the functions
            as inputs, so that standard quantizers find them after inlining.
        fuse: Fused kernels inside the functions (``passes/fuse_ops.py``): ``none``;
            ``standard``, ONNX's ``Attention``, ``RMSNormalization`` and ``RotaryEmbedding``
            (the model is declared at opset 24); ``onnxruntime``, ONNX Runtime's contrib kernels
            (``GroupQueryAttention``, ``SkipSimplifiedLayerNormalization``, ...).
    """

    fold_leftovers: bool = False
    fuse_constants: bool = False
    optimize: bool = False
    weights_as_initializers: bool = False
    fuse: Fusion = "none"

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "fuse":
                _require_bool("RewriteOptions", f.name, getattr(self, f.name))
        if self.fuse not in FUSIONS:
            raise OptionsError(
                "RewriteOptions.fuse", f"must be one of {FUSIONS}, got {self.fuse!r}"
            )


@dataclass(frozen=True)
class AttentionOptions:
    """Attention handling (see hyperexport.library.transformers.attention).

    Attributes:
        implementation: Name registered in transformers' AttentionInterface, or None to leave the
            model's attention alone. Not one of transformers' built-ins (``eager``, ``sdpa``...).

    ``promote_opset24`` is gone: ``RewriteOptions(fuse="standard")`` makes ONNX ``Attention``
    (and ONNX's other fused ops).
    """

    implementation: str | None = None

    def __post_init__(self) -> None:
        impl = self.implementation
        if impl is not None and (not isinstance(impl, str) or not impl):
            raise OptionsError("AttentionOptions.implementation", f"must be a name, got {impl!r}")
        if impl in BUILTIN_ATTENTION:
            raise OptionsError(
                "AttentionOptions.implementation",
                f"{impl!r} is a transformers built-in; name hyperexport's entry otherwise",
            )


def _axes_items(value: Any) -> AxesItems:
    """``{name: {axis: dim}}`` or its item tuples, checked, as nested item tuples."""
    where = "ExportOptions.dynamic_axes"
    items = value.items() if isinstance(value, Mapping) else value
    result = []
    for entry in items:
        name, axes = entry
        if not isinstance(name, str) or not name:
            raise OptionsError(where, f"input names must be strings, got {name!r}")
        pairs = axes.items() if isinstance(axes, Mapping) else axes
        checked = []
        for axis, dim in pairs:
            _require_int(f"{where}[{name!r}]", axis, 0)
            if not isinstance(dim, str) or not dim.isidentifier():
                raise OptionsError(
                    f"{where}[{name!r}][{axis}]",
                    f"dim names must be identifiers, got {dim!r}",
                )
            checked.append((axis, dim))
        result.append((name, tuple(sorted(checked))))
    return tuple(result)


def _shape_items(value: Any) -> ShapeItems:
    where = "ExportOptions.probe_shapes"
    items = value.items() if isinstance(value, Mapping) else value
    result = []
    for name, shape in items:
        if not isinstance(name, str) or not name:
            raise OptionsError(where, f"input names must be strings, got {name!r}")
        for size in shape:
            _require_int(f"{where}[{name!r}]", size, 0)
        result.append((name, tuple(shape)))
    return tuple(result)


@dataclass(frozen=True)
class ExportOptions:
    """Options of :func:`hyperexport.export_hyper_onnx` beyond its HyperONNX-compatible signature.

    Attributes:
        functions: ``per_instance`` bakes each instance's weights into its own function;
            ``per_type`` shares one function per module structure and passes weights as inputs.
        fallback: If the chosen export path fails, try the other one (logged at WARNING and
            recorded in the model's metadata).
        custom_ops: User symbolics registered for the TorchScript path during export.
        rewrite: Rewrite-pass switches.
        attention: Attention registration and promotion.
        external_data_threshold: Tensors at least this many bytes go to the external data file
            when external data is on.
        dynamic_axes: ``{input name: {axis: dim name}}`` (a mapping, or its item tuples), on
            both paths; dim names are identifiers. The model then runs a second time at another
            shape (the probe) to find which dimensions of every hiera call are dynamic; the
            check stage compares the export with torch at that shape.
        probe_shapes: ``{input name: shape}`` of that second run (default: each dynamic
            dimension grows by a small amount).
        method: Name of the model method to export, when it is not ``forward``.
        context_length: The longest sequence a generation step runs (its model's context
            length). With ``rewrite.fuse: onnxruntime`` the step's attention then reads constant
            rotary tables of that many positions by ``position_ids``
            (``passes/rotary_tables.py``); 0 (unknown): per-token rows. ``task:
            text-generation`` sets it from the model's config.

    Raises:
        OptionsError: A value has the wrong type or is out of range; names the option.
    """

    functions: FunctionMode = PER_INSTANCE
    fallback: bool = False
    custom_ops: tuple[CustomOpSymbolic, ...] = ()
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    attention: AttentionOptions = field(default_factory=AttentionOptions)
    external_data_threshold: int = 1024
    dynamic_axes: AxesItems = ()
    probe_shapes: ShapeItems = ()
    method: str = "forward"
    context_length: int = 0

    def __post_init__(self) -> None:
        if self.functions not in FUNCTION_MODES:
            raise OptionsError(
                "ExportOptions.functions",
                f"must be one of {FUNCTION_MODES}, got {self.functions!r}",
            )
        _require_bool("ExportOptions", "fallback", self.fallback)
        ops = self.custom_ops
        if not isinstance(ops, (tuple, list)) or not all(
            isinstance(op, CustomOpSymbolic) for op in ops
        ):
            raise OptionsError("ExportOptions.custom_ops", "must be a tuple of CustomOpSymbolic")
        for name, kind in (("rewrite", RewriteOptions), ("attention", AttentionOptions)):
            if not isinstance(getattr(self, name), kind):
                got = type(getattr(self, name)).__name__
                raise OptionsError(f"ExportOptions.{name}", f"must be a {kind.__name__}, got {got}")
        _require_int("ExportOptions.external_data_threshold", self.external_data_threshold, 0)
        _require_int("ExportOptions.context_length", self.context_length, 0)
        if not isinstance(self.method, str) or not self.method.isidentifier():
            raise OptionsError(
                "ExportOptions.method", f"must be a method name, got {self.method!r}"
            )
        # Normalised in place (the dataclass is frozen): mappings and lists become item tuples.
        object.__setattr__(self, "custom_ops", tuple(ops))
        object.__setattr__(self, "dynamic_axes", _axes_items(self.dynamic_axes))
        object.__setattr__(self, "probe_shapes", _shape_items(self.probe_shapes))


def _check_names(where: str, names: Any) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise OptionsError(where, f"must be a list of names, got {names!r}")
    if not all(isinstance(n, str) and n for n in names):
        raise OptionsError(where, f"must hold non-empty strings, got {list(names)!r}")
    if len(set(names)) != len(names):
        raise OptionsError(where, f"holds a name twice: {list(names)!r}")
    return tuple(names)


def _is_binary_writer(f: Any) -> bool:
    return callable(getattr(f, "write", None)) and not isinstance(f, io.TextIOBase)


def _check_destination(path: Path) -> None:
    """``f`` names a file that can be written: not a folder, under a writable folder (missing
    folders on the way are created by the export)."""
    if path.is_dir():
        raise OptionsError("f", f"{path} is a directory; name the .onnx file to write")
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:  # missing folders are created
        folder = folder.parent
    if not folder.is_dir():
        raise OptionsError("f", f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OptionsError("f", f"folder {folder} is not writable")


@dataclass(frozen=True)
class ExportRequest:
    """``export_hyper_onnx``'s flat arguments, checked before anything runs.

    Attributes:
        f: Destination: a path, or a binary file object (``io.BytesIO``, a file opened ``"wb"``).
        opset_version: Default-domain opset, within what the chosen path supports.
        dynamo: The export path; a bool, always given explicitly by the caller.
        external_data: Large tensors go to ``<f>.data`` beside ``f`` (needs a path ``f``).
        input_names: Names of the flattened graph inputs, or None.
        output_names: Names of the flattened graph outputs, or None (fewer names than outputs:
            the rest are numbered).
        options: Everything else.

    Raises:
        OptionsError: Names the argument and what is wrong with it.
        OpsetError: ``opset_version`` is outside what the chosen path supports.
    """

    f: Any
    opset_version: int
    dynamo: bool
    external_data: bool = False
    input_names: tuple[str, ...] | None = None
    output_names: tuple[str, ...] | None = None
    options: ExportOptions = field(default_factory=ExportOptions)

    def __post_init__(self) -> None:
        _require_bool("export_hyper_onnx", "dynamo", self.dynamo)
        _require_bool("export_hyper_onnx", "external_data", self.external_data)
        low, high = OPSET_RANGES[self.dynamo]
        path = f"dynamo={self.dynamo}"
        if isinstance(self.opset_version, bool) or not isinstance(self.opset_version, int):
            raise OptionsError(
                "opset_version", f"must be an int, got {type(self.opset_version).__name__}"
            )
        if not low <= self.opset_version <= high:
            raise OpsetError(
                f"opset {self.opset_version} is outside what the {path} path supports "
                f"({low}..{high})"
            )
        if not isinstance(self.options, ExportOptions):
            raise OptionsError(
                "options", f"must be an ExportOptions, got {type(self.options).__name__}"
            )
        is_path = isinstance(self.f, (str, os.PathLike))
        if not is_path and not _is_binary_writer(self.f):
            raise OptionsError(
                "f", f"must be a path or a binary file object, got {type(self.f).__name__}"
            )
        if is_path:
            _check_destination(Path(os.fspath(self.f)))
        if self.external_data and not is_path:
            raise OptionsError(
                "external_data", "needs a file path for f (the data file goes beside it)"
            )
        object.__setattr__(self, "input_names", _check_names("input_names", self.input_names))
        object.__setattr__(self, "output_names", _check_names("output_names", self.output_names))

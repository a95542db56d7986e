"""HyperONNX's public names and defaults on top of hyperexport: switching is a changed import.

``from hyperonnx import export_hyper_onnx`` becomes
``from hyperexport.compat.hyperonnx import export_hyper_onnx`` (and the same for
``hyperonnx.transformers`` and ``hyperonnx.transformers.attention``, whose names are all here).

What is HyperONNX's here:

* ``export_hyper_onnx`` with HyperONNX's keywords and defaults: opset 19, ``do_optimization``,
  ``fold_nodes_to_functions`` and ``fuse_constants_to_function`` on, unknown keywords ignored
  with a WARNING, ``dynamic_axes`` also as ``{name: [axes]}``, ``external_data`` with a file
  object (the data goes to ``external_directory``, or the working directory with a WARNING);
  functions are named ``Class:idx`` in domain :data:`HYPER_DOMAIN`.
* ``auto_trace_method``, ``patch_transformers``, ``register_attention_opsets``,
  ``attention_interface``, ``attention_translation_table``, ``promote_onnx_model_to_opset24``,
  ``StaticCache``, ``HYPER_DOMAIN``, ``HYPERONNX_ATTN_IMPL``.

What stays hyperexport's (see the README's compatibility section): the export runs hyperexport's
pipeline (the files kept in ``external_directory`` are its per-unit files under ``units/``, the
return value is its :class:`~hyperexport.base.contracts.manifest.ExportManifest`), ``module_spec``
and the ``compile_*``/``cutlass_*`` keywords are ignored, folding covers the main graph only,
and the attention op is hyperexport's (``hyperexport::attention``, promoted by its pass).
``register_attention_opsets`` registers process-wide, as HyperONNX does; hyperexport's own API
registers only for the duration of an export.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import onnx
import onnx_ir as ir
import torch

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.versions import torchscript_opset
from hyperexport.library.api import export_hyper_onnx as _export
from hyperexport.library.compat.auto_trace import MethodTracer, trace_method
from hyperexport.library.compat.function_names import rename_functions
from hyperexport.library.options import ExportOptions, RewriteOptions
from hyperexport.library.passes.promote_attention import PromoteAttentionToOpset24Pass
from hyperexport.library.transformers.attention import (
    hyperexport_attention_forward,
    registered_attention,
)
from hyperexport.library.transformers.attention_onnx import (
    attention_translation_table as _translation_table,
)
from hyperexport.library.transformers.attention_onnx import torchscript_attention_symbolic
from hyperexport.library.transformers.patches import export_patches
from hyperexport.library.transformers.static_cache import StaticCache

log = logging.getLogger(__name__)

__all__ = [
    "HYPERONNX_ATTN_IMPL",
    "HYPER_DOMAIN",
    "StaticCache",
    "attention_interface",
    "attention_translation_table",
    "auto_trace_method",
    "export_hyper_onnx",
    "patch_transformers",
    "promote_onnx_model_to_opset24",
    "register_attention_opsets",
]

#: HyperONNX's function domain.
HYPER_DOMAIN = "hyper"
#: The attention implementation name HyperONNX registers in transformers.
HYPERONNX_ATTN_IMPL = "onnx_attention_opset24"
#: HyperONNX's default opset.
DEFAULT_OPSET = 19


def _axes(dynamic_axes: Mapping[str, Any] | None) -> dict[str, dict[int, str]] | None:
    """``{name: {axis: dim}}``; HyperONNX (as torch.onnx.export) also takes ``{name: [axes]}``."""
    if not dynamic_axes:
        return None
    result: dict[str, dict[int, str]] = {}
    for name, axes in dynamic_axes.items():
        if isinstance(axes, Mapping):
            result[name] = {int(a): str(d) for a, d in axes.items()}
        else:
            result[name] = {int(a): f"{name}_dim{int(a)}".replace(".", "_") for a in axes}
    return result


def export_hyper_onnx(
    model: torch.nn.Module,
    input_args: Any,
    f: str | os.PathLike[str] | IO[bytes],
    *,
    kwargs: Mapping[str, Any] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | None = None,
    dynamo: bool = False,
    external_data: bool = False,
    hiera: Collection[type[torch.nn.Module]] | None = None,
    module_spec: Any = None,
    do_optimization: bool = True,
    fold_nodes_to_functions: bool = True,
    fuse_constants_to_function: bool = True,
    external_directory: str | os.PathLike[str] | None = None,
    dynamic_axes: Mapping[str, Any] | None = None,
    method: str = "forward",
    **ignored: Any,
) -> ExportManifest:
    """HyperONNX's ``export_hyper_onnx``, with its defaults, through hyperexport.

    Args:
        model: The module to export.
        input_args: Example positional inputs; a trailing dict holds keyword inputs.
        f: A path or a binary file object.
        kwargs: Example keyword inputs.
        input_names: Names of the graph inputs.
        output_names: Names of the first graph outputs (the rest are numbered).
        opset_version: Default-domain opset. None: HyperONNX's default, 19, or on the
            TorchScript path the highest its exporter gets right where that is lower (17 on
            torch 2.2; ``versions.torchscript_opset``).
        dynamo: The torch exporter to use. HyperONNX's own default, ``False`` (the TorchScript
            exporter), is kept here so that its users can switch by changing the import;
            hyperexport's :func:`~hyperexport.export_hyper_onnx` has no default and requires it.
        external_data: Large tensors in a separate data file (beside a path ``f``; in
            ``external_directory`` for a file object).
        hiera: Module classes whose calls become functions (the root's class too).
        module_spec: HyperONNX's internal cache; ignored with a WARNING.
        do_optimization: Run the optimizer (functions kept).
        fold_nodes_to_functions: Fold the main graph's leftover nodes into functions.
        fuse_constants_to_function: Move constants fed to a call into the function.
        external_directory: Keep hyperexport's per-unit ONNX files here (under ``units/``).
        dynamic_axes: ``{name: {axis: dim}}`` or ``{name: [axes]}``.
        method: (hyperexport) the model method to export.
        **ignored: Any other keyword (HyperONNX's ``compile_hier``, ``cutlass_*``...): ignored
            with a WARNING naming it, as HyperONNX does.

    Returns:
        hyperexport's export manifest (HyperONNX returns None with ``hiera``).
    """
    if ignored:
        log.warning("export_hyper_onnx: ignored argument(s): %s", ", ".join(sorted(ignored)))
    if module_spec is not None:
        log.warning("export_hyper_onnx: module_spec (HyperONNX's internal cache) is ignored")
    options = ExportOptions(
        rewrite=RewriteOptions(
            fold_leftovers=bool(fold_nodes_to_functions),
            fuse_constants=bool(fuse_constants_to_function),
            optimize=bool(do_optimization),
        ),
        method=method,
    )
    if opset_version is None:
        opset_version = DEFAULT_OPSET if dynamo else torchscript_opset(DEFAULT_OPSET)
    directory = Path(external_directory) if external_directory is not None else None
    keywords: dict[str, Any] = {
        "kwargs": kwargs,
        "input_names": input_names,
        "output_names": output_names,
        "opset_version": opset_version,
        "dynamo": dynamo,
        "hiera": list(hiera or ()),
        "dynamic_axes": _axes(dynamic_axes),
        "options": options,
    }
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        keywords["external_directory"] = directory
    if isinstance(f, (str, os.PathLike)):
        manifest = _export(model, input_args, f, external_data=external_data, **keywords)
        _rename_file(Path(f))
        return manifest
    if external_data:
        return _export_to_file_object_with_data(model, input_args, f, directory, keywords)
    buffer = io.BytesIO()
    manifest = _export(model, input_args, buffer, **keywords)
    proto = onnx.load_from_string(buffer.getvalue())
    rename_functions(proto, HYPER_DOMAIN)
    f.write(proto.SerializeToString())
    return manifest


def _rename_file(path: Path) -> None:
    proto = onnx.load_model(path, load_external_data=False)
    rename_functions(proto, HYPER_DOMAIN)
    atomic_write_bytes(path, proto.SerializeToString())


def _export_to_file_object_with_data(
    model: torch.nn.Module,
    args: Any,
    f: IO[bytes],
    directory: Path | None,
    keywords: dict[str, Any],
) -> ExportManifest:
    """HyperONNX's ``external_data`` with a file object: the data file goes to ``directory``."""
    if directory is None:
        directory = Path.cwd()
        log.warning(
            "export_hyper_onnx: external_data with a file object and no external_directory; "
            "the data file goes to the working directory %s (as HyperONNX does)",
            directory,
        )
    name = f"{type(model).__name__}.onnx"
    with tempfile.TemporaryDirectory(dir=directory, prefix=".hyperonnx-") as tmp:
        staged = Path(tmp) / name
        manifest = _export(model, args, staged, external_data=True, **keywords)
        proto = onnx.load_model(staged, load_external_data=False)
        data = staged.with_name(f"{name}.data")
        if data.exists():
            os.replace(data, directory / data.name)
    rename_functions(proto, HYPER_DOMAIN)
    f.write(proto.SerializeToString())
    return manifest


@contextlib.contextmanager
def auto_trace_method(method: Any, expected_stages: int = 1) -> Iterator[MethodTracer]:
    """Record the calls of ``method`` while the model runs; ``tracer.export(f, ...)`` exports it.

    Args:
        method: A bound method (``model._foo``), of a module or of any object.
        expected_stages: How many calls to record; one more raises ``StopIteration``.

    Yields:
        The tracer; its ``export`` takes this module's ``export_hyper_onnx`` keywords.
    """
    with trace_method(method, expected_stages, export_hyper_onnx) as tracer:
        yield tracer


@contextlib.contextmanager
def patch_transformers() -> Iterator[None]:
    """The transformers patches a plain ``torch.onnx.export`` of a transformers model needs.

    hyperexport's export applies the patches each path needs by itself; this is for exports
    that call ``torch.onnx.export`` directly, as HyperONNX users do. Restored on exit.
    """
    with export_patches(dynamo=False):
        yield


def attention_interface(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention call convention (HyperONNX's argument order: ``scaling`` sixth).

    No mask means causal attention. The output is ``(batch, seq, heads, dim)`` as transformers
    expects; the call exports as one ``hyperexport.attention::Attention`` node.
    """
    return hyperexport_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


_registrations = contextlib.ExitStack()
_registered: list[bool] = []


def register_attention_opsets() -> None:
    """Register :data:`HYPERONNX_ATTN_IMPL` in transformers and the TorchScript symbolic.

    Process-wide and idempotent, as in HyperONNX; :func:`unregister_attention_opsets` undoes it.
    """
    if _registered:
        return
    _registrations.enter_context(registered_attention(HYPERONNX_ATTN_IMPL))
    _registrations.enter_context(torchscript_attention_symbolic())
    _registered.append(True)
    log.info("registered attention %r process-wide", HYPERONNX_ATTN_IMPL)


def unregister_attention_opsets() -> None:
    """Undo :func:`register_attention_opsets` (hyperexport's addition)."""
    _registrations.close()
    _registered.clear()


def attention_translation_table() -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``."""
    return _translation_table()


def promote_onnx_model_to_opset24(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite the attention nodes to default-domain ONNX ``Attention`` and the model to opset 24.

    Raises:
        RewriteError: The model holds something the promotion cannot carry over faithfully.
    """
    ir_model = ir.serde.deserialize_model(model)
    result = PromoteAttentionToOpset24Pass()(ir_model)
    return ir.serde.serialize_model(result.model)

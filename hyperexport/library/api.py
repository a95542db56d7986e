"""The library entry points, usable without Hydra.

``export_hyper_onnx`` is signature-compatible with HyperONNX's function of the same name. The
build stages call the finer-grained steps (capture, export units, compose, save) one by one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.capture_spec import CaptureSpec
from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.records import CaptureRecord, tree_tensor_keys
from hyperexport.base.errors import OptionsError
from hyperexport.base.versions import torchscript_opset
from hyperexport.library.capture.capture_model import capture_model
from hyperexport.library.capture.container import Capture
from hyperexport.library.capture.hiera_classes import resolve_hiera
from hyperexport.library.capture.root import root_as_function
from hyperexport.library.capture.tree import qualified_name
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.library.export.fallback import (
    CaptureCall,
    export_units_with_fallback,
    export_with_fallback,
)
from hyperexport.library.export.registry import path_for
from hyperexport.library.export.units import export_units
from hyperexport.library.export_budget import check_disk_budget, check_export_budget, state_bytes
from hyperexport.library.model_file import save_model, serialize_inline
from hyperexport.library.options import ExportOptions, ExportRequest
from hyperexport.library.passes.pipeline import compose_model

log = logging.getLogger(__name__)

__all__ = [
    "Capture",
    "ExportBundle",
    "capture_model",
    "compose_model",
    "export_hyper_onnx",
    "export_units",
    "export_units_with_fallback",
    "save_model",
]


def _axes_by_leaf_name(
    model: Any,
    args: Any,
    kwargs: Mapping[str, Any] | None,
    options: ExportOptions,
    names: list[str],
) -> ExportOptions:
    """Key dynamic axes (and probe shapes) by the inputs' leaf names, not the user's names."""
    from hyperexport.library.capture import signature, tree

    fn = getattr(model, options.method)
    bound = signature.bind(fn, args if isinstance(args, tuple) else (args,), dict(kwargs or {}))
    leaves = tree.leaf_names(tree.flatten(bound, "model input", []))
    rename = dict(zip(names, leaves))
    return replace(
        options,
        dynamic_axes=tuple((rename.get(k, k), v) for k, v in options.dynamic_axes),
        probe_shapes=tuple((rename.get(k, k), v) for k, v in options.probe_shapes),
    )


_HYPERONNX_REWRITES = {
    "do_optimization": "optimize",
    "fold_nodes_to_functions": "fold_leftovers",
    "fuse_constants_to_function": "fuse_constants",
}


def _hyperonnx_keywords(
    options: ExportOptions, given: Mapping[str, Any]
) -> tuple[ExportOptions, Path | None]:
    """Map HyperONNX's keywords onto ExportOptions; reject anything else by name."""
    given = dict(given)
    rewrite: dict[str, Any] = {
        _HYPERONNX_REWRITES[k]: bool(given.pop(k)) for k in list(given) if k in _HYPERONNX_REWRITES
    }
    if rewrite:
        options = replace(options, rewrite=replace(options.rewrite, **rewrite))
    if given.pop("module_spec", None) is not None:
        log.warning("export_hyper_onnx: module_spec (HyperONNX's internal cache) is ignored")
    directory = given.pop("external_directory", None)
    if given:
        raise TypeError(f"export_hyper_onnx: unsupported argument(s) {sorted(given)}")
    return options, Path(directory) if directory is not None else None


def split_trailing_kwargs(
    args: Any, kwargs: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` as ``torch.onnx.export`` reads them: a trailing dict is keywords.

    A tuple ``args`` whose last element is a dict passes that dict as keyword arguments (an empty
    trailing dict is dropped, which is how a dict is passed as the last *positional* argument).
    A non-tuple ``args`` is one positional argument.

    Raises:
        OptionsError: A keyword is given both in the trailing dict and in ``kwargs``.
    """
    if not isinstance(args, tuple):
        return (args,), dict(kwargs or {})
    merged = dict(kwargs or {})
    if args and isinstance(args[-1], dict) and not _is_model_output(args[-1]):
        trailing = args[-1]
        both = sorted(set(trailing) & set(merged))
        if both:
            raise OptionsError("args", f"keyword(s) {both} given in args' trailing dict and kwargs")
        merged = {**trailing, **merged}
        args = args[:-1]
    return args, merged


def _is_model_output(value: Any) -> bool:
    import dataclasses

    return dataclasses.is_dataclass(value)


def complete_output_names(
    given: tuple[str, ...] | None, record: CaptureRecord
) -> tuple[str, ...] | None:
    """The user's output names, with numbered names for outputs beyond them.

    As with ``torch.onnx.export``, fewer names than outputs name the first outputs; the rest get
    ``output_<i>`` (``i`` is the output's position).

    Raises:
        OptionsError: More names than the model has tensor outputs.
    """
    if given is None:
        return None
    count = len(list(tree_tensor_keys(record.outputs)))
    if len(given) > count:
        raise OptionsError(
            "output_names", f"{len(given)} names for {count} tensor output(s): {list(given)}"
        )
    taken = set(given)
    rest = []
    for i in range(len(given), count):
        name = f"output_{i}"
        while name in taken:
            name = f"_{name}"
        taken.add(name)
        rest.append(name)
    if rest:
        log.info("output_names names %d of %d outputs; the rest are numbered", len(given), count)
    return (*given, *rest)


def _check_model_and_hiera(model: Any, hiera: Any) -> None:
    """A torch module, and ``hiera`` a sequence (a string would be read letter by letter)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise OptionsError("model", f"must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(hiera, (str, bytes, type)):
        raise OptionsError(
            "hiera", f"must be a list of classes or import paths, not one {type(hiera).__name__}"
        )


def _check_symbolics(options: ExportOptions) -> None:
    """Every custom-op symbolic imports and is callable, before the model runs."""
    import importlib

    for op in options.custom_ops:
        module, _, name = op.symbolic.partition(":")
        try:
            target = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            message = f"symbolic {op.symbolic!r} cannot be imported: {e}"
            raise OptionsError("custom_ops", message) from e
        if not callable(target):
            raise OptionsError(
                "custom_ops", f"symbolic {op.symbolic!r} is a {type(target).__name__}, not callable"
            )


def export_hyper_onnx(
    model: Any,
    args: Any,
    f: str | os.PathLike[str] | IO[bytes],
    *,
    kwargs: Mapping[str, Any] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | None = None,
    dynamo: bool | None = None,
    hiera: Sequence[type | str] | None = None,
    external_data: bool = False,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    options: ExportOptions | None = None,
    **hyperonnx: Any,
) -> ExportManifest:
    """Export ``model`` to ONNX with every call of a ``hiera`` class as a local function.

    Every argument is checked before the model runs (:class:`~hyperexport.library.options.ExportRequest`).

    Args:
        model: The torch module (exported in its current mode; call ``eval()`` first).
        args: Positional example inputs (tuple or single tensor). As in ``torch.onnx.export``,
            a dict as the tuple's last element holds keyword inputs.
        f: Destination path, or a binary file object such as ``io.BytesIO``.
        kwargs: Keyword example inputs.
        input_names: Names of the flattened graph inputs (default: from the signature).
        output_names: Names of the flattened graph outputs (default: from the output structure).
            Fewer names than outputs name the first ones; the rest are numbered ``output_<i>``.
        opset_version: Default-domain opset. TorchScript path: up to 20 on torch 2.13. None:
            18 (``DEFAULT_OPSET``), or on the TorchScript path the highest its exporter gets
            right where that is lower (17 on torch 2.2; ``versions.torchscript_opset``).
        dynamo: Which torch exporter to use: ``True`` (``torch.export``, the dynamo exporter) or
            ``False`` (the TorchScript exporter). Required: torch's own default changed in 2.9,
            so there is no default here (:mod:`hyperexport.compat.hyperonnx` keeps HyperONNX's).
        hiera: Module classes (or import paths) whose calls become functions. The root model's
            own class makes the whole model one function (the main graph calls it once). A
            class that never runs is a WARNING naming it (a build's recipe is stricter).
        external_data: Store large tensors in ``<f>.data`` beside ``f`` (needs a path ``f``).
        dynamic_axes: ``{input name: {axis: dim name}}``.
        options: Everything else: function mode, fallback, rewrites, attention, custom ops.
        **hyperonnx: HyperONNX's own keywords, so that its users can switch by changing the
            import: ``do_optimization``, ``fold_nodes_to_functions`` and
            ``fuse_constants_to_function`` set the matching rewrite options;
            ``external_directory`` keeps the per-module ONNX files there; ``module_spec`` (its
            internal cache) is ignored with a WARNING. Any other keyword is a TypeError (see
            :mod:`hyperexport.compat.hyperonnx` for HyperONNX's lenient defaults).

    Returns:
        The export manifest (functions and call sites).

    Raises:
        OptionsError: An argument or option is invalid, or ``dynamo`` is not given (before
            anything runs).
        VersionsError: The installed libraries cannot serve the chosen path (before capture).
    """
    if dynamo is None:
        raise OptionsError(
            "dynamo",
            "must be given: dynamo=True (torch.export, the dynamo exporter) or dynamo=False "
            "(the TorchScript exporter); there is no default, torch's own changed in 2.9",
        )
    _check_model_and_hiera(model, hiera)
    if opset_version is None:
        opset_version = DEFAULT_OPSET if dynamo else torchscript_opset(DEFAULT_OPSET)
    request = ExportRequest(
        f=f,
        opset_version=opset_version,
        dynamo=dynamo,
        external_data=external_data,
        input_names=input_names,  # type: ignore[arg-type]  # ExportRequest checks, then tuples
        output_names=output_names,  # type: ignore[arg-type]
        options=options if options is not None else ExportOptions(),
    )
    args, kwargs = split_trailing_kwargs(args, kwargs)
    options, keep_units = _hyperonnx_keywords(request.options, hyperonnx)
    _check_symbolics(options)
    check_export_budget(state_bytes(model), external_data=external_data)
    if dynamic_axes:
        # As with torch.onnx.export, entries may name outputs too; which output dims are dynamic
        # follows from the inputs' (found by the probe run), so only the inputs' entries count.
        outputs = set(request.output_names or ())
        options = replace(
            options,
            dynamic_axes=tuple(
                (k, tuple(sorted(v.items()))) for k, v in dynamic_axes.items() if k not in outputs
            ),
        )
    classes = resolve_hiera(tuple(hiera or ()))
    model = root_as_function(model, classes, options.method)
    if options.dynamic_axes and request.input_names:
        options = _axes_by_leaf_name(model, args, kwargs, options, list(request.input_names))
    # The same frozen specification the build's trace writes; the inputs are the caller's.
    spec = CaptureSpec(
        hiera=tuple(qualified_name(c) for c in classes),
        method=options.method,
        dynamo=dynamo,
        attention=options.attention.implementation,
        dynamic_axes=options.dynamic_axes,
        probe_shapes=options.probe_shapes,
    )
    capture_call = CaptureCall(model, args, kwargs, spec, classes)
    path = path_for(spec.dynamo)
    capture = capture_call(path)
    output_names = complete_output_names(request.output_names or None, capture.record)
    with contextlib.ExitStack() as stack:
        if keep_units is None:
            # Beside the output, so that its weight file can become the output's data file by
            # a rename (same filesystem): the weights are written once.
            near = Path(f).parent if isinstance(f, (str, os.PathLike)) else None
            if near is not None:
                near.mkdir(parents=True, exist_ok=True)
            bundle_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix=".hyperexport-", dir=near))
            )
        else:
            bundle_dir = keep_units
        # written once (the units' data file becomes the output's by a rename)
        check_disk_budget(state_bytes(model), bundle_dir)
        _, capture = export_with_fallback(
            model,
            capture,
            path=path,
            opset=opset_version,
            options=options,
            out_dir=bundle_dir,
            input_names=request.input_names or None,
            output_names=output_names,
            recapture=capture_call,
        )
        onnx_model, manifest = compose_model(bundle_dir, options=options, record=capture.record)
        # Inside the bundle's lifetime: the model's weights are references into its data file.
        if isinstance(f, (str, os.PathLike)):
            save_model(
                onnx_model,
                Path(f),
                external_data=external_data,
                threshold=options.external_data_threshold,
                consume_bundle=keep_units is None,
            )
        else:
            f.write(serialize_inline(onnx_model))
    return manifest

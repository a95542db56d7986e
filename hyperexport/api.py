"""The library entry points, usable without Hydra.

``export_hyper_onnx`` is signature-compatible with HyperONNX's function of the same name. The
build stages call the finer-grained steps (capture, export units, compose, save) one by one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import onnx_ir as ir

from hyperexport.atomic import atomic_write_text
from hyperexport.capture.hooks import Capture, capture_model, resolve_hiera
from hyperexport.capture.root import root_as_function
from hyperexport.contracts.bundle import BUNDLE_JSON, ExportBundle
from hyperexport.contracts.manifest import ExportManifest
from hyperexport.contracts.records import CaptureRecord, tree_tensor_keys
from hyperexport.errors import InputError, ModuleExportError, OptionsError
from hyperexport.export.units import export_units
from hyperexport.options import ExportOptions, ExportRequest
from hyperexport.passes.pipeline import compose_model

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


def save_model(model: ir.Model, path: Path, *, external_data: bool, threshold: int = 1024) -> None:
    """Write ``model`` to ``path`` atomically.

    With ``external_data``, every tensor of at least ``threshold`` bytes goes to
    ``<name>.data`` beside the model: initializers, and also the Constant tensors inside
    functions (per-instance weights). The data file is moved into place first and the model
    last, so a reader never sees a model without its data. Nothing depends on the working
    directory, and an earlier export's files at ``path`` are replaced.
    """
    import onnx
    from onnx.external_data_helper import set_external_data, write_external_data_tensors

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    proto = ir.serde.serialize_model(model)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        staged = Path(tmp) / path.name
        data = Path(tmp) / f"{path.name}.data"
        if external_data:
            moved = 0
            for tensor in _all_tensors(proto):
                if tensor.HasField("raw_data") and len(tensor.raw_data) >= threshold:
                    set_external_data(tensor, data.name)
                    moved += 1
            if moved:
                write_external_data_tensors(proto, tmp)
        onnx.save_model(proto, staged)
        if data.exists():
            os.replace(data, path.parent / data.name)
        os.replace(staged, path)


def _all_tensors(proto: Any) -> Iterator[Any]:
    """Every TensorProto of a model: initializers and tensor attributes, in graphs and functions."""

    def of_nodes(nodes: Any) -> Iterator[Any]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for graph in attr.graphs:
                    yield from of_graph(graph)

    def of_graph(graph: Any) -> Iterator[Any]:
        yield from graph.initializer
        yield from of_nodes(graph.node)

    yield from of_graph(proto.graph)
    for function in proto.functions:
        yield from of_nodes(function.node)


def export_units_with_fallback(
    model: Any,
    capture: Capture,
    *,
    opset: int,
    dynamo: bool,
    options: ExportOptions,
    out_dir: Path,
    input_names: tuple[str, ...] | None = None,
    output_names: tuple[str, ...] | None = None,
    recapture: Callable[[bool], Capture] | None = None,
) -> tuple[ExportBundle, Capture]:
    """:func:`export_units`, retried once on the other path if ``options.fallback`` allows it.

    What a capture records depends on the path (the TorchScript path captures under
    ``torch.jit.trace``), so the retry first captures again for the other path with
    ``recapture(dynamo)``; the capture the export used is returned with the bundle, and the
    bundle's copy of the record is that capture's.

    Only an export failure falls back: :class:`ModuleExportError` (torch.onnx.export failed) or
    :class:`InputError` (the path cannot take these inputs, e.g. dynamic axes through
    placeholders on the dynamo path). The fallback is logged at WARNING with its cause, and
    ``bundle.fallback_from`` (hence the model's metadata and the manifest) records it.

    Args:
        model: The live model.
        capture: Its capture.
        opset: Default-domain opset of the export.
        dynamo: The export path tried first.
        options: Export options; ``options.fallback`` enables the retry.
        out_dir: The bundle directory (a failed attempt's unit files are removed before the
            retry).
        input_names: Names of the flattened root inputs, if given by the user.
        output_names: Names of the flattened root outputs, if given by the user.
        recapture: Captures the model for a given path; without it the retry reuses
            ``capture`` (fine for models whose forward does not depend on tracing).

    Returns:
        The bundle, and the capture it was exported from.

    Raises:
        ModuleExportError: The export failed; with fallback, on both paths (the retry's error,
            whose ``__cause__`` is the first path's).
        InputError: The inputs cannot be exported on the path(s) tried.
    """
    kwargs: dict[str, Any] = {
        "opset": opset,
        "options": options,
        "out_dir": out_dir,
        "input_names": input_names,
        "output_names": output_names,
    }
    try:
        return export_units(model, capture, dynamo=dynamo, **kwargs), capture
    except (ModuleExportError, InputError) as e:
        if not options.fallback:
            raise
        log.warning(
            "export with dynamo=%s failed (%s); falling back to dynamo=%s as asked",
            dynamo,
            e,
            not dynamo,
        )
        first = e
    units = out_dir / "units"
    if units.is_dir():
        shutil.rmtree(units)
    try:
        if recapture is not None:
            capture = recapture(not dynamo)
        bundle = export_units(model, capture, dynamo=not dynamo, **kwargs)
    except (ModuleExportError, InputError) as e:
        raise e from first
    bundle = replace(bundle, fallback_from=f"dynamo={dynamo}: {type(first).__name__}: {first}")
    atomic_write_text(out_dir / BUNDLE_JSON, bundle.dumps())
    return bundle, capture


def _axes_by_leaf_name(
    model: Any,
    args: Any,
    kwargs: Mapping[str, Any] | None,
    options: ExportOptions,
    names: list[str],
) -> ExportOptions:
    """Key dynamic axes (and probe shapes) by the inputs' leaf names, not the user's names."""
    from hyperexport.capture import signature, tree

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
    rewrite = {
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


def export_hyper_onnx(
    model: Any,
    args: Any,
    f: str | os.PathLike[str] | IO[bytes],
    *,
    kwargs: Mapping[str, Any] | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int = 18,
    dynamo: bool = False,
    hiera: Sequence[type | str] | None = None,
    external_data: bool = False,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    options: ExportOptions | None = None,
    **hyperonnx: Any,
) -> ExportManifest:
    """Export ``model`` to ONNX with every call of a ``hiera`` class as a local function.

    Every argument is checked before the model runs (:class:`~hyperexport.options.ExportRequest`).

    Args:
        model: The torch module (exported in its current mode; call ``eval()`` first).
        args: Positional example inputs (tuple or single tensor). As in ``torch.onnx.export``,
            a dict as the tuple's last element holds keyword inputs.
        f: Destination path, or a binary file object such as ``io.BytesIO``.
        kwargs: Keyword example inputs.
        input_names: Names of the flattened graph inputs (default: from the signature).
        output_names: Names of the flattened graph outputs (default: from the output structure).
            Fewer names than outputs name the first ones; the rest are numbered ``output_<i>``.
        opset_version: Default-domain opset. TorchScript path: up to 20 on torch 2.13.
        dynamo: Which torch exporter to use. Always explicit; torch's own default changed in 2.9.
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
        OptionsError: An argument or option is invalid (before anything runs).
    """
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
    axes = {k: dict(v) for k, v in options.dynamic_axes}

    def capture_for(path: bool) -> Capture:
        return capture_model(
            model,
            args,
            kwargs,
            hiera=classes,
            method=options.method,
            dynamo=path,
            attention=options.attention.implementation,
            dynamic_axes=axes or None,
            probe_shapes={k: tuple(v) for k, v in options.probe_shapes} or None,
        )

    capture = capture_for(dynamo)
    names = {
        "input_names": request.input_names or None,
        "output_names": complete_output_names(request.output_names or None, capture.record),
    }
    with contextlib.ExitStack() as stack:
        if keep_units is None:
            bundle_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="hyperexport-"))
            )
        else:
            bundle_dir = keep_units
        _, capture = export_units_with_fallback(
            model,
            capture,
            opset=opset_version,
            dynamo=dynamo,
            options=options,
            out_dir=bundle_dir,
            recapture=capture_for,
            **names,
        )
        onnx_model, manifest = compose_model(bundle_dir, options=options, record=capture.record)
    if isinstance(f, (str, os.PathLike)):
        save_model(
            onnx_model,
            Path(f),
            external_data=external_data,
            threshold=options.external_data_threshold,
        )
    else:
        f.write(ir.serde.serialize_model(onnx_model).SerializeToString())
    return manifest

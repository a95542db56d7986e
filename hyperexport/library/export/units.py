"""Export a captured model unit by unit: the root, and each distinct hiera call body.

A *unit* is a module exported on its own with its direct hiera children replaced by
placeholders. The export path (an :class:`~hyperexport.library.export.path.ExportPath`, chosen once
here from ``dynamo``) exports the units: one ``torch.onnx.export`` call per unit on the
TorchScript path, one call for all units on the dynamo path (``dynamo_path.py``). The result is
an :class:`ExportBundle`: one ONNX file per unit plus ``bundle.json``, which the compose pass
turns into one model with local functions.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir
import torch

from hyperexport.base.atomic import atomic_write_bytes, atomic_write_text
from hyperexport.base.contracts.bundle import BUNDLE_JSON, CAPTURE_RECORD, ExportBundle, UnitEntry
from hyperexport.base.contracts.names import ROOT_UNIT, UNITS_DIR, probe_key
from hyperexport.base.contracts.records import (
    LONE_TENSOR,
    CaptureRecord,
    ModuleCall,
    Tree,
    tree_tensor_keys,
)
from hyperexport.base.errors import ModuleExportError
from hyperexport.library.capture import signature, tree
from hyperexport.library.capture.container import Capture
from hyperexport.library.export.jobs import UnitJob
from hyperexport.library.export.placeholders import (
    PlaceholderSpec,
    module_weights,
    symbolic_output_dims,
)
from hyperexport.library.export.registry import path_for
from hyperexport.library.export.streamed import (
    externalize_streamed,
    one_program_bound,
    one_unit_bound,
    streamed_export,
)
from hyperexport.library.export.unit_graphs import graph_digest
from hyperexport.library.export.unit_identity import plan_units
from hyperexport.library.export.weights import WEIGHTS_FILE, Locator, WeightFile, WeightSources
from hyperexport.library.options import PER_TYPE, ExportOptions
from hyperexport.library.public import set_module

log = logging.getLogger(__name__)

ROOT = ROOT_UNIT

#: Receives the weight file and where its bytes are (:meth:`WeightFile.sources`).
SourcesSink = Callable[[Path, WeightSources], None]


@set_module("hyperexport.export.units")
class _UnitModule(torch.nn.Module):
    """Calls the exported module from flat tensors, and returns its tensors flat.

    The exporter then sees exactly the inputs and outputs we name, in our order, whatever the
    module's own signature (kwargs, nested tuples, dicts, ModelOutputs, constants).
    """

    def __init__(
        self,
        inner: torch.nn.Module,
        call: Callable[..., Any],
        inputs: Tree,
        signature_of: Callable[..., Any],
    ) -> None:
        super().__init__()
        self.inner = inner
        self._call = call
        self._signature_of = signature_of
        self._inputs = inputs
        self._positions = {k: i for i, k in enumerate(tree_tensor_keys(inputs))}

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        bound = tree.unflatten(self._inputs, lambda k: flat[self._positions[k]])
        args, kwargs = signature.split(self._signature_of, bound)
        out = self._call(*args, **kwargs)
        tensors: list[torch.Tensor] = []
        tree.flatten(out, "output", tensors)
        return tuple(tensors)


def export_units(
    model: torch.nn.Module,
    capture: Capture,
    *,
    opset: int,
    dynamo: bool,
    options: ExportOptions,
    out_dir: Path,
    input_names: tuple[str, ...] | None = None,
    output_names: tuple[str, ...] | None = None,
    locate: Locator | None = None,
    declare_sources: SourcesSink | None = None,
) -> ExportBundle:
    """Export the root and every distinct hiera call body of ``capture`` into ``out_dir``.

    ``dynamo`` selects the export path (:func:`hyperexport.library.export.registry.path_for`); the
    path exports the unit jobs made here, and each unit is written as the path yields it.

    ``locate`` places the weights in the files they were loaded from (a streamed model's are
    placed by name without it); when every tensor of ``units/weights.data`` was placed,
    ``declare_sources`` receives the file and its sources.

    Raises:
        OpsetError: ``opset`` is outside the path's range.
        ModuleExportError: torch.onnx.export failed; names the module path and the path used.
    """
    path = path_for(dynamo)
    path.check_opset(opset)
    record = capture.record
    modules = dict(model.named_modules())
    # Bodies are always exported once per module *structure*, with weights as inputs. In
    # per-instance mode, the SpecializePerInstancePass later clones a body for each instance and
    # bakes that instance's weights in, which costs far less than exporting every instance.
    plan = plan_units(record, modules, PER_TYPE)
    units_dir = out_dir / UNITS_DIR
    units_dir.mkdir(parents=True, exist_ok=True)
    in_names = input_names or tuple(tree.leaf_names(record.inputs))
    out_names = output_names or _root_output_names(record.outputs, in_names)

    entries: list[UnitEntry] = []
    jobs: list[UnitJob] = []
    names = (in_names, out_names)
    op_names = {c.call_id: f"P{c.order}" for c in record.calls}
    started = time.perf_counter()
    for unit in plan:
        call = record.call(unit.call_ids[0]) if unit.call_ids else None
        children = record.children(call.call_id if call else None)
        specs = [
            PlaceholderSpec(
                op_names[c.call_id],
                c,
                tuple(n for n, _ in module_weights(modules[c.path])),
                symbolic_output_dims(record, c),
            )
            for c in children
        ]
        weights = tuple(n for n, _ in module_weights(modules[call.path])) if call else ()
        entry = UnitEntry(
            name=unit.name,
            call_ids=unit.call_ids,
            module_path=call.path if call else "",
            class_name=call.class_name if call else record.model_class,
            weights=weights,
            placeholders=tuple((s.op_type, s.call.call_id) for s in specs),
            split_reason=unit.split_reason,
        )
        jobs.append(
            _unit_job(model, modules, capture, unit.name, call, specs, options, names, dynamo)
        )
        entries.append(entry)
    # Weights go to one external data file, each written once straight from the live model
    # (or, streamed, from the checkpoint: streamed.py); the unit files hold only references.
    paths = {e.name: e.module_path for e in entries}
    with (
        WeightFile(units_dir / WEIGHTS_FILE, locate) as data_file,
        streamed_export(model, record, modules) as streamed,
    ):
        units = path.export(
            jobs, model=model, modules=modules, capture=capture, opset=opset, options=options
        )
        if streamed is not None:
            bind = one_program_bound if path.one_program else one_unit_bound
            units = bind(units, jobs, streamed)
        merge = _SameGraphs(entries, options.functions == PER_TYPE)
        for name, unit_model in units:
            if not merge.add(name, unit_model):
                continue
            if streamed is not None:
                externalize_streamed(unit_model.graph, paths[name], streamed, data_file)
            _write_unit(unit_model, units_dir / f"{name}.onnx", data_file)
    if declare_sources is not None:
        _declare_sources(data_file, declare_sources)
    entries = merge.entries()
    for entry in entries:
        if entry.split_reason and options.functions == PER_TYPE:
            log.info(
                "per_type: %s at %r gets a function of its own; it %s",
                entry.class_name.rsplit(".", 1)[-1],
                entry.module_path,
                entry.split_reason,
            )
    log.info(
        "exported %d units for %d hiera calls (%s) in %.2fs",
        len(entries),
        len(record.calls),
        path.label,
        time.perf_counter() - started,
    )
    bundle = ExportBundle(
        dynamo=dynamo,
        opset=opset,
        function_mode=options.functions,
        units=tuple(entries),
        root_input_names=in_names,
        root_output_names=out_names,
    )
    atomic_write_text(out_dir / CAPTURE_RECORD, record.dumps())
    atomic_write_text(out_dir / BUNDLE_JSON, bundle.dumps())
    return bundle


def _declare_sources(data_file: WeightFile, declare: SourcesSink) -> None:
    """Hand ``declare`` the closed ``data_file``'s sources, or say why there are none."""
    sources = data_file.sources()
    if sources is not None:
        declare(data_file.path, sources)
        log.info(
            "%s: sources declared: %d tensors are ranges of %d checkpoint files, %d (%d bytes) "
            "only in this file",
            data_file.path.name,
            len(sources.copies),
            len({stored.source for _, stored in sources.copies}),
            len(sources.unplaced),
            sources.unplaced_bytes,
        )
    elif data_file.tensors_written:
        log.info(
            "%s: no sources declared: none of its %d tensors is a copy of a checkpoint's",
            data_file.path.name,
            data_file.tensors_written,
        )


class _SameGraphs:
    """Folds a unit into an earlier one of its class when both export the same graph.

    The plan splits calls whose forward reads differ (:mod:`.unit_identity`); when the
    difference never reached the graph (an ``Identity`` in one layer, an eval-mode drop-path
    in the next), the calls share the earlier unit's function after all, and an INFO line says
    so. Only units without placeholders (no nested calls) and with the same weights are folded.
    """

    def __init__(self, entries: Sequence[UnitEntry], per_type: bool) -> None:
        self._level = logging.INFO if per_type else logging.DEBUG
        self._entries = {e.name: e for e in entries}
        self._order = [e.name for e in entries]
        self._seen: dict[tuple[str, str], str] = {}  # (class, graph digest) -> unit name
        self._folded: dict[str, str] = {}  # unit name -> the unit it joins

    def add(self, name: str, unit_model: ir.Model) -> bool:
        """Note ``name``'s exported graph; False when it joins an earlier unit (not written)."""
        entry = self._entries[name]
        if not entry.call_ids or entry.placeholders:
            return True
        weights = {f"inner.{w}" for w in entry.weights}
        key = (entry.class_name, graph_digest(unit_model, weights))
        earlier = self._seen.setdefault(key, name)
        if earlier == name or self._entries[earlier].weights != entry.weights:
            return True
        self._folded[name] = earlier
        log.log(
            self._level,
            "per_type: %s at %r shares the function of %r: it %s, but exports the same graph",
            entry.class_name.rsplit(".", 1)[-1],
            entry.module_path,
            self._entries[earlier].module_path,
            entry.split_reason or "differs in its signature",
        )
        return False

    def entries(self) -> list[UnitEntry]:
        """The entries with every folded unit's calls moved into the unit it joins."""
        result: dict[str, UnitEntry] = {}
        for name in self._order:
            entry = self._entries[name]
            target = self._folded.get(name)
            if target is None:
                result[name] = entry
                continue
            kept = result[target]
            result[target] = dataclasses.replace(kept, call_ids=(*kept.call_ids, *entry.call_ids))
        return list(result.values())


#: Node metadata torch's dynamo exporter writes that names this machine and this process: each
#: op's stack trace, with the absolute paths of the checkout and of site-packages, and fx's
#: per-process ``<eval_with_key>.N`` counters. Dropped when a unit is written, so that its bytes
#: depend on the model and the library versions only (the same build in another clone, on another
#: machine or after another build in the same process gives the same model); what the exporter
#: says about the model itself (namespace, class hierarchy, fx node, name scopes) stays.
MACHINE_METADATA = ("pkg.torch.onnx.stack_trace",)


def _write_unit(unit_model: ir.Model, path: Path, weights: WeightFile) -> None:
    """Write one unit: its large tensors to the shared weight file, its graph to ``path``,
    without :data:`MACHINE_METADATA`."""
    weights.externalize(unit_model.graph)
    owners: list[ir.Graph | ir.Function] = [unit_model.graph, *unit_model.functions.values()]
    for owner in owners:
        for node in ir.traversal.RecursiveGraphIterator(owner):
            for key in MACHINE_METADATA:
                node.metadata_props.pop(key, None)
    atomic_write_bytes(path, ir.to_proto(unit_model).SerializeToString())


def _root_output_names(outputs: Tree, inputs: Sequence[str] = ()) -> tuple[str, ...]:
    """Leaf names of the root outputs, prefixed with ``output`` unless they read as names that
    no input has (a model may return an input object, e.g. its cache)."""
    names = tree.leaf_names(outputs)
    if any(not n[0].isalpha() or n == LONE_TENSOR or n in inputs for n in names):
        names = tree.leaf_names(outputs, "output")
    return tuple(names)


def _unit_job(
    model: torch.nn.Module,
    modules: Mapping[str, torch.nn.Module],
    capture: Capture,
    name: str,
    call: ModuleCall | None,
    specs: list[PlaceholderSpec],
    options: ExportOptions,
    root_names: tuple[tuple[str, ...], tuple[str, ...]],
    dynamo: bool,
) -> UnitJob:
    """What one unit's export takes: its wrapper module, example inputs and names."""
    record = capture.record
    if call is None:
        inner, fn, inputs = model, getattr(model, options.method), record.inputs
        sig = fn
        names_in, names_out = list(root_names[0]), list(root_names[1])
        outputs = record.outputs
    else:
        inner = modules[call.path]
        fn, inputs, outputs = inner, call.inputs, call.outputs
        sig = type(inner).forward.__get__(inner)
        names_in = [f"in.{i}" for i, _ in enumerate(tree_tensor_keys(inputs))]
        names_out = [f"out.{i}" for i, _ in enumerate(tree_tensor_keys(outputs))]
    path = call.path if call else ""
    if not names_out:
        raise ModuleExportError(path, dynamo, ValueError("returns no tensor"))
    # The wrapper takes the module's mode: the exporter sets and then restores the mode of the
    # module it is given, recursively, which must not flip the user's model to training.
    return UnitJob(
        name=name,
        module_path=path,
        wrapper=_UnitModule(inner, fn, inputs, sig).train(inner.training),
        inputs=tuple(capture.tensor(k) for k in tree_tensor_keys(inputs)),
        input_names=tuple(names_in),
        output_names=tuple(names_out),
        dynamic_axes=dynamic_axes_of(record, inputs, outputs, names_in, names_out, options),
        specs=tuple(specs),
    )


def _dim_names(record: CaptureRecord, options: ExportOptions) -> dict[tuple[int, int], str]:
    """``(traced size, probe size) -> dim name`` of the root inputs' dynamic axes."""
    meta = {t.key: t for t in record.tensors}
    names: dict[tuple[int, int], str] = {}
    leaves = dict(zip(tree.leaf_names(record.inputs), tree_tensor_keys(record.inputs)))
    for name, axes in options.dynamic_axes:
        key = leaves.get(name)
        if key is None or probe_key(key) not in meta:
            continue
        for axis, dim in axes:
            names[(meta[key].shape[axis], meta[probe_key(key)].shape[axis])] = dim
    return names


def dynamic_axes_of(
    record: CaptureRecord,
    inputs: Tree,
    outputs: Tree,
    names_in: list[str],
    names_out: list[str],
    options: ExportOptions,
) -> dict[str, dict[int, str]]:
    """Dynamic axes of one unit's graph inputs and outputs, read off the probe run.

    A dimension is dynamic when its size differs between the capture and the probe; it takes
    the name of the root dimension with the same pair of sizes, else ``<value>_<axis>``.
    """
    if record.probe_inputs is None:
        return {}
    meta = {t.key: t for t in record.tensors}
    pairs = _dim_names(record, options)
    axes: dict[str, dict[int, str]] = {}
    for keys, names in (
        (tree_tensor_keys(inputs), names_in),
        (tree_tensor_keys(outputs), names_out),
    ):
        for key, name in zip(keys, names):
            dims = record.dynamic_dims(key)
            if dims:
                shape, probe = meta[key].shape, meta[probe_key(key)].shape
                axes[name] = {d: pairs.get((shape[d], probe[d]), f"{name}_{d}") for d in dims}
    return axes

"""The dynamo path (``dynamo=True``, :class:`DynamoPath`): every unit in one ``torch.export``
and one ``torch.onnx.export``. Its placeholder op and the single-program export are in
``dynamo.py``.

A hierarchical export has one unit per distinct hiera call body, plus the root. Exporting them one
by one pays ``torch.export``'s and ``torch.onnx``'s fixed per-call costs (``run_decompositions``
re-registers every CompositeImplicitAutograd kernel on each call) once per unit, which made the
hierarchical export of a small ResNet 2.5 times a plain one. Here every unit is traced inside one
combined module, exported once, and the ONNX graph is cut back into one model per unit:

* :class:`_BatchModule` takes every unit's flat inputs in turn, calls each unit's wrapper and
  returns every unit's outputs. Around each call it tells the :class:`PlaceholderRouter` which
  unit is being traced, so that the same module instance is a placeholder while its parent unit
  is traced and runs for real while its own unit is.
* Each unit's model is the backward slice of the batch graph from that unit's outputs to its
  inputs (``onnx_ir.convenience.extract``, which copies nodes, so that a node shared between units
  lands in each). It is then named exactly as a unit exported alone: inputs and outputs as asked,
  initializers by the unit's own state-dict names, its own dynamic dimension names, and only the
  opsets it uses.
* Dynamic dimensions get one ``torch.export.Dim`` per unit and name: two units' dims are different
  symbols even when their names match, so that no unit's graph reads a size off another unit's
  input (torch computes a symbolic size from the first input that carries the symbol).

A failure inside a unit's trace names that unit's module. Any other failure (after the trace, in
the ONNX translation, or a batch graph that cannot be cut into units) makes the units export one
by one, so that the error names the module it belongs to; if they all succeed alone, their
results are used and a WARNING says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import onnx_ir as ir
import torch

from hyperexport.base.contracts.names import OPSET_RANGES
from hyperexport.base.errors import HyperExportError, ModuleExportError, relayed
from hyperexport.library.capture.container import Capture
from hyperexport.library.capture.model_patches import export_context
from hyperexport.library.export.dynamo_program import (
    apply_placeholder,
    export_dynamo,
    export_program,
    name_dynamic_dims,
    name_graph_values,
    to_dynamic_shapes,
)
from hyperexport.library.export.jobs import UnitJob
from hyperexport.library.export.path import ExportPath
from hyperexport.library.export.placeholders import Dim, PlaceholderRouter, ShapeFunction
from hyperexport.library.options import ExportOptions
from hyperexport.library.public import set_module

log = logging.getLogger(__name__)


class DynamoPath(ExportPath):
    """``dynamo=True``: ``torch.export`` (non-strict) then ``torch.onnx.export``, all units at once.

    Its placeholder is a ``torch.library`` custom op with an ONNX translation (``dynamo.py``).
    """

    name = "dynamo"
    dynamo = True
    one_program = True
    opsets = range(OPSET_RANGES[True][0], OPSET_RANGES[True][1] + 1)

    def apply_placeholder(
        self,
        op_type: str,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        output_dims: Sequence[tuple[Dim, ...]] = (),
        derived: ShapeFunction | None = None,
    ) -> Sequence[torch.Tensor]:
        return apply_placeholder(op_type, inputs, outputs, output_dims, derived)

    def export(
        self,
        jobs: Sequence[UnitJob],
        *,
        model: torch.nn.Module,
        modules: Mapping[str, torch.nn.Module],
        capture: Capture,
        opset: int,
        options: ExportOptions,
    ) -> Iterator[tuple[str, ir.Model]]:
        specs = [s for job in jobs for s in job.specs]
        router = PlaceholderRouter(specs, capture, self.apply_placeholder)
        with export_context(model, True, options.attention.implementation) as translations:
            exported = export_batch(
                jobs,
                modules=modules,
                router=router,
                model=model,
                opset=opset,
                translations=translations,
            )
        for name in list(exported):  # in the jobs' order; each let go once written
            yield name, exported.pop(name)


class _UnitTraceError(Exception):
    """A unit's trace raised inside the batch: carries the unit, for the error message."""

    def __init__(self, job: UnitJob, cause: BaseException) -> None:
        super().__init__(f"unit {job.name}: {relayed(cause)}")
        self.job = job
        self.cause = cause


@set_module("hyperexport.export.dynamo_path")
class _BatchModule(torch.nn.Module):
    """Calls every unit's wrapper in turn on its slice of the flat inputs; returns all outputs.

    Only the model is registered (as ``model``), not the unit wrappers: ``torch.export`` lifts a
    weight once per path it is registered under, and each wrapper registers its own module again
    (nine ResNet units made 168 weight inputs out of 36, and twice the decomposition time). The
    wrappers reach the same module objects, whose weights ``torch.export`` swaps in place.
    """

    def __init__(
        self, model: torch.nn.Module, jobs: Sequence[UnitJob], router: PlaceholderRouter
    ) -> None:
        super().__init__()
        self.model = model
        self._jobs = tuple(jobs)
        self._router = router
        # Not .train(): that would recurse into the user's modules.
        self.training = model.training

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results: list[torch.Tensor] = []
        start = 0
        for job in self._jobs:
            args = flat[start : start + len(job.inputs)]
            start += len(job.inputs)
            try:
                with self._router.unit(job.specs):
                    outputs = job.wrapper(*args)
            except _UnitTraceError:
                raise
            except Exception as e:
                raise _UnitTraceError(job, e) from e
            if len(outputs) != len(job.output_names):
                raise _UnitTraceError(
                    job,
                    RuntimeError(
                        f"returned {len(outputs)} tensors, expected {len(job.output_names)}"
                    ),
                )
            results.extend(outputs)
        return tuple(results)


def export_batch(
    jobs: Sequence[UnitJob],
    *,
    modules: Mapping[str, torch.nn.Module],
    router: PlaceholderRouter,
    model: torch.nn.Module,
    opset: int,
    translations: Mapping[Any, Any] | None = None,
) -> dict[str, ir.Model]:
    """Export every unit of ``jobs`` in one trace; return each unit's model.

    The models' weight initializers are references to the live model's tensors
    (``ir.TorchTensor``), not copies.

    Every module that ``router`` stands in for is patched for the duration, and restored.

    Args:
        jobs: The units, root first.
        modules: Every module of the model by its path.
        router: Placeholders of every job's children (made before the trace starts).
        opset: Default-domain opset.
        model: The root model (every unit's module is one of its submodules).
        translations: Extra ``custom_translation_table`` entries (attention).

    Raises:
        ModuleExportError: The export failed; names the unit's module.
        HyperExportError: A unit's trace raised one (e.g. an InputError from a placeholder).
    """
    started = time.perf_counter()
    batch = _BatchModule(model, jobs, router)
    try:
        with router.patched(modules):
            onnx_model = _export(batch, jobs, opset, translations)
        exported = time.perf_counter()
        result = split_units(onnx_model, jobs, batch)
    except _UnitTraceError as e:
        if isinstance(e.cause, HyperExportError):
            raise e.cause from e.cause.__cause__
        raise ModuleExportError(e.job.module_path, True, e.cause) from e.cause
    except HyperExportError:
        raise  # already names what is wrong (e.g. a dynamic axis torch specialised)
    except Exception as e:  # torch's errors are of many types; the rerun names the unit
        log.info("batched dynamo export failed (%s); exporting unit by unit", relayed(e))
        return _export_one_by_one(jobs, modules, router, opset, translations)
    log.debug(
        "dynamo batch: %d units exported in %.2fs, split in %.2fs",
        len(jobs),
        exported - started,
        time.perf_counter() - exported,
    )
    return result


def _export(
    batch: _BatchModule,
    jobs: Sequence[UnitJob],
    opset: int,
    translations: Mapping[Any, Any] | None,
) -> ir.Model:
    """``torch.export`` (non-strict) then ``torch.onnx.export(dynamo=True)`` of the batch."""
    flat = tuple(t for job in jobs for t in job.inputs)
    names, axes = _batch_axes(jobs)
    shapes = to_dynamic_shapes(flat, names, axes)
    return export_program(batch, flat, shapes, opset, translations)


def _batch_axes(jobs: Sequence[UnitJob]) -> tuple[list[str], dict[str, dict[int, str]]]:
    """Batch input names, and dynamic axes with one identifier dim name per unit and name."""
    names: list[str] = []
    axes: dict[str, dict[int, str]] = {}
    for index, job in enumerate(jobs):
        dims: dict[str, str] = {}
        unit_axes = job.input_axes
        for name in job.input_names:
            batch_name = f"{job.name}::{name}"
            names.append(batch_name)
            if name in unit_axes:
                axes[batch_name] = {
                    axis: dims.setdefault(dim, f"u{index}_d{len(dims)}")
                    for axis, dim in unit_axes[name].items()
                }
    return names, axes


def split_units(
    model: ir.Model, jobs: Sequence[UnitJob], batch: torch.nn.Module
) -> dict[str, ir.Model]:
    """Cut the batch model into one self-contained model per unit.

    Initializers keep their tensors (references to the torch storage): nothing is copied.

    Raises:
        RuntimeError: The batch graph does not have the jobs' inputs and outputs, or a unit's
            outputs depend on another unit's inputs.
    """
    graph = model.graph
    n_in = sum(len(job.inputs) for job in jobs)
    n_out = sum(len(job.output_names) for job in jobs)
    if len(graph.inputs) != n_in or len(graph.outputs) != n_out:
        raise RuntimeError(
            f"the batch graph has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs, "
            f"expected {n_in} and {n_out}"
        )
    tensors = _batch_tensors(batch)
    result: dict[str, ir.Model] = {}
    start_in = start_out = 0
    for job in jobs:
        inputs = list(graph.inputs[start_in : start_in + len(job.inputs)])
        outputs = list(graph.outputs[start_out : start_out + len(job.output_names)])
        start_in += len(job.inputs)
        start_out += len(job.output_names)
        try:
            unit_graph = ir.convenience.extract(graph, inputs, outputs)
        except ValueError as e:
            raise RuntimeError(f"unit {job.name} is not separable from the batch: {e}") from e
        _order_initializers_as(unit_graph, graph)
        unit = _unit_model(model, unit_graph, job, tensors)
        result[job.name] = unit
    return result


def _order_initializers_as(unit: ir.Graph, batch: ir.Graph) -> None:
    """Put the unit's initializers in the batch graph's order.

    ``extract`` collects them in a set of values, hashed by address: iterated as it comes, the
    order (of the unit's initializers, their value_info and the weight file) changed from one
    process to the next.
    """
    position = {name: index for index, name in enumerate(batch.initializers)}
    values = sorted(unit.initializers.values(), key=lambda v: position[v.name or ""])
    for value in values:
        unit.initializers.pop(value.name or "")
    for value in values:
        unit.initializers.add(value)


def _batch_tensors(batch: torch.nn.Module) -> dict[str, int]:
    """``{state-dict name (every alias): id of the tensor}`` of the batch module."""
    named = [
        *batch.named_parameters(remove_duplicate=False),
        *batch.named_buffers(remove_duplicate=False),
    ]
    return {name: id(tensor) for name, tensor in named}


def _unit_names(wrapper: torch.nn.Module) -> dict[int, str]:
    """``{id of a tensor: its first state-dict name in the unit wrapper}``."""
    names: dict[int, str] = {}
    for name, tensor in [
        *wrapper.named_parameters(remove_duplicate=False),
        *wrapper.named_buffers(remove_duplicate=False),
    ]:
        names.setdefault(id(tensor), name)
    return names


def _unit_model(
    batch_model: ir.Model, graph: ir.Graph, job: UnitJob, tensors: Mapping[str, int]
) -> ir.Model:
    """The unit's graph named as if it had been exported alone, in a model of its own."""
    name_graph_values(graph, job.input_names, job.output_names)
    name_dynamic_dims(graph, job.input_names, job.input_axes)
    _name_unit_initializers(graph, tensors, _unit_names(job.wrapper))
    functions = _used_functions(graph, batch_model.functions)
    domains = {"", *(n.domain for n in ir.traversal.RecursiveGraphIterator(graph))}
    for function in functions:
        domains.add(function.domain)
        domains.update(n.domain for n in function)
    graph.opset_imports.clear()
    graph.opset_imports.update({d: v for d, v in batch_model.opset_imports.items() if d in domains})
    graph.name = batch_model.graph.name
    return ir.Model(
        graph,
        ir_version=batch_model.ir_version,
        producer_name=batch_model.producer_name,
        producer_version=batch_model.producer_version,
        functions=functions,
        metadata_props=dict(batch_model.metadata_props),
    )


def _name_unit_initializers(
    graph: ir.Graph, tensors: Mapping[str, int], unit_names: Mapping[int, str]
) -> None:
    """Rename each weight initializer from its batch name to its name in the unit's wrapper.

    The batch names a weight by the first unit wrapper that reaches it; the unit's own name
    (``inner.<state-dict name relative to the unit's module>``) is what the compose pass and the
    per-type weight inputs go by. Initializers that are no weight of the unit (constants lifted
    by ``torch.export``) keep their names.
    """
    for value in list(graph.initializers.values()):
        old = value.name or ""
        target = unit_names.get(tensors.get(old, -1))
        if target is None or target == old:
            continue
        graph.initializers.pop(old)
        if target in graph.initializers:
            value.replace_all_uses_with(graph.initializers[target])
            continue
        value.name = target
        graph.initializers[target] = value


def _used_functions(
    graph: ir.Graph, functions: Mapping[ir.OperatorIdentifier, ir.Function]
) -> list[ir.Function]:
    """The model-local functions that the graph calls, directly or through other functions."""
    used: dict[ir.OperatorIdentifier, ir.Function] = {}
    stack = [node.op_identifier() for node in ir.traversal.RecursiveGraphIterator(graph)]
    while stack:
        key = stack.pop()
        function = functions.get(key)
        if function is None or key in used:
            continue
        used[key] = function
        stack.extend(node.op_identifier() for node in function)
    return [f.clone() for f in used.values()]


def _export_one_by_one(
    jobs: Sequence[UnitJob],
    modules: Mapping[str, torch.nn.Module],
    router: PlaceholderRouter,
    opset: int,
    translations: Mapping[Any, Any] | None,
) -> dict[str, ir.Model]:
    """Export each unit alone (the slow path, after the batch failed): errors name the unit."""
    result: dict[str, ir.Model] = {}
    with router.patched(modules):
        for job in jobs:
            try:
                with router.unit(job.specs):
                    result[job.name] = export_dynamo(
                        job.wrapper,
                        job.inputs,
                        opset=opset,
                        input_names=list(job.input_names),
                        output_names=list(job.output_names),
                        dynamic_axes=job.dynamic_axes,
                        specs=job.specs,
                        translations=translations,
                    )
            except HyperExportError:
                raise
            except Exception as e:
                raise ModuleExportError(job.module_path, True, e) from e
    log.warning(
        "batched dynamo export failed but every unit exported alone; the units were exported "
        "one by one"
    )
    return result

"""Compose an export bundle into the final model: the declared pass list, run by onnx_ir.

:data:`PASSES` is the whole pipeline, in order, compose included: each entry says when it runs
(always, or on an option) and how its pass is made (options go into the pass's constructor).
A new pass is one module under ``passes/``, one entry here, and its tests in ``tests/passes/``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import (
    RemoveUnusedFunctionsPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
    TopologicalSortPass,
)

from hyperexport.base.contracts.bundle import BUNDLE_JSON, CAPTURE_RECORD, ExportBundle
from hyperexport.base.contracts.manifest import ExportManifest
from hyperexport.base.contracts.names import NO_FUSION, ONNXRUNTIME_FUSION, UNITS_DIR
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import RewriteError
from hyperexport.library.model_file import load_model
from hyperexport.library.options import PER_INSTANCE, ExportOptions
from hyperexport.library.passes.build_manifest import build_manifest
from hyperexport.library.passes.compose_functions import ComposeFunctionsPass, function_names
from hyperexport.library.passes.fold_leftovers import FoldLeftoversPass
from hyperexport.library.passes.fuse_constants import FuseConstantsIntoFunctionsPass
from hyperexport.library.passes.optimize import OptimizeKeepFunctionsPass
from hyperexport.library.passes.prune_function_io import PruneFunctionIOPass
from hyperexport.library.passes.specialize_instances import SpecializePerInstancePass
from hyperexport.library.passes.weights_as_initializers import WeightsAsInitializersPass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassInputs:
    """What the pass factories may read: the options, the bundle, the capture, the units.

    Attributes:
        options: The export options (rewrite flags, attention).
        bundle: The export bundle being composed.
        record: The capture record the bundle was exported from.
        units: Unit name -> the unit's exported model (the root excluded).
    """

    options: ExportOptions
    bundle: ExportBundle
    record: CaptureRecord
    units: Mapping[str, ir.Model]


@dataclass(frozen=True)
class PassEntry:
    """One entry of the pass list.

    Attributes:
        name: The entry's name, as in logs and errors.
        when: Whether it runs for these inputs (an option flag, or always).
        make: Makes the pass.
    """

    name: str
    when: Callable[[PassInputs], bool]
    make: Callable[[PassInputs], ir.passes.PassBase]


def _always(_: PassInputs) -> bool:
    return True


def _per_instance(inputs: PassInputs) -> bool:
    return inputs.bundle.function_mode == PER_INSTANCE


def _specialize(inputs: PassInputs) -> SpecializePerInstancePass:
    names = function_names(inputs.bundle, inputs.record)
    units = [u for u in inputs.bundle.units if u.call_ids]
    return SpecializePerInstancePass(
        weights={names[u.name]: frozenset(u.weights) for u in units},
        classes={names[u.name]: u.class_name for u in units},
    )


def _fuse(inputs: PassInputs) -> ir.passes.PassBase:
    # Imported here: onnxscript's rewriter (tens of MB) loads only when a fusion runs.
    from hyperexport.library.passes.fuse_ops import FuseOpsPass

    return FuseOpsPass(inputs.options.rewrite.fuse)


def _share_kv_buffer(inputs: PassInputs) -> ir.passes.PassBase:
    # A generation step's pasts as onnxruntime-genai's shared buffers; nothing elsewhere.
    from hyperexport.library.passes.share_kv_buffer import ShareKVBufferPass

    return ShareKVBufferPass()


def _pack_matmuls(inputs: PassInputs) -> ir.passes.PassBase:
    # MatMuls on one activation (query/key/value, gate/up) as one, as the builder packs them.
    from hyperexport.library.passes.pack_matmuls import PackMatMulsPass

    return PackMatMulsPass()


def _shared_sizes(inputs: PassInputs) -> ir.passes.PassBase:
    # Sizes the fused kernels and the shared buffer read, off the inputs every call shares.
    from hyperexport.library.passes.shared_sizes import ReadSharedSizesPass

    return ReadSharedSizesPass()


def _padding_mask(inputs: PassInputs) -> ir.passes.PassBase:
    # The main graph's causal mask as the padding mask, where only causal kernels read it.
    from hyperexport.library.passes.padding_mask import PaddingMaskPass

    return PaddingMaskPass()


def _rotary_in_attention(inputs: PassInputs) -> ir.passes.PassBase:
    # Each step's rotation inside its GroupQueryAttention, on the packed projection.
    from hyperexport.library.passes.rotary_in_attention import RotaryInAttentionPass

    return RotaryInAttentionPass()


def _rotary_tables(inputs: PassInputs) -> ir.passes.PassBase:
    # The rotations' tables as constants read by position_ids, the context length known.
    from hyperexport.library.passes.rotary_tables import RotaryTablesPass

    return RotaryTablesPass(inputs.options.context_length, inputs.record)


def _load_time_fusions(inputs: PassInputs) -> ir.passes.PassBase:
    del inputs
    from hyperexport.library.passes.load_time_fusions import LoadTimeFusionsPass

    return LoadTimeFusionsPass()


def _hoist_invariants(inputs: PassInputs) -> ir.passes.PassBase:
    from hyperexport.library.passes.hoist_invariants import HoistInvariantsPass

    return HoistInvariantsPass(constants=not inputs.options.rewrite.fuse_constants)


def _attention_sizes(inputs: PassInputs) -> ir.passes.PassBase:
    # The attention's sizes in the fewest kernels, once they are read off the mask.
    from hyperexport.library.passes.attention_sizes import AttentionSizesPass

    return AttentionSizesPass()


#: The pipeline, in order.
PASSES: tuple[PassEntry, ...] = (
    PassEntry(
        "compose",
        _always,
        lambda i: ComposeFunctionsPass(i.units, i.bundle, i.record),
    ),
    PassEntry("specialize_instances", _per_instance, _specialize),
    PassEntry(
        "optimize", lambda i: i.options.rewrite.optimize, lambda i: OptimizeKeepFunctionsPass()
    ),
    PassEntry(
        "fuse_constants",
        lambda i: i.options.rewrite.fuse_constants,
        lambda i: FuseConstantsIntoFunctionsPass(),
    ),
    PassEntry(
        "weights_as_initializers",
        lambda i: i.options.rewrite.weights_as_initializers,
        lambda i: WeightsAsInitializersPass(),
    ),
    PassEntry("prune_function_io", _always, lambda i: PruneFunctionIOPass()),
    PassEntry(
        "fold_leftovers",
        lambda i: i.options.rewrite.fold_leftovers,
        lambda i: FoldLeftoversPass(),
    ),
    PassEntry(
        "fuse",
        lambda i: i.options.rewrite.fuse != NO_FUSION,
        _fuse,
    ),
    PassEntry(
        "pack_matmuls",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _pack_matmuls,
    ),
    PassEntry(
        "share_kv_buffer",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _share_kv_buffer,
    ),
    PassEntry(
        "rotary_in_attention",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _rotary_in_attention,
    ),
    PassEntry(
        "rotary_tables",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION and i.options.context_length > 0,
        _rotary_tables,
    ),
    PassEntry(
        "shared_sizes",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _shared_sizes,
    ),
    PassEntry(
        "attention_sizes",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _attention_sizes,
    ),
    PassEntry(
        "padding_mask",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _padding_mask,
    ),
    PassEntry(
        "load_time_fusions",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _load_time_fusions,
    ),
    PassEntry(
        "hoist_invariants",
        lambda i: i.options.rewrite.fuse == ONNXRUNTIME_FUSION,
        _hoist_invariants,
    ),
    PassEntry("remove_unused_nodes", _always, lambda i: RemoveUnusedNodesPass()),
    PassEntry("remove_unused_functions", _always, lambda i: RemoveUnusedFunctionsPass()),
    PassEntry("remove_unused_opsets", _always, lambda i: RemoveUnusedOpsetsPass()),
    PassEntry("topological_sort", _always, lambda i: TopologicalSortPass()),
)


def selected_passes(inputs: PassInputs) -> list[tuple[str, ir.passes.PassBase]]:
    """The entries of :data:`PASSES` that run for ``inputs``, with their passes, in order."""
    return [(entry.name, entry.make(inputs)) for entry in PASSES if entry.when(inputs)]


def run_passes(model: ir.Model, inputs: PassInputs) -> ir.passes.PassResult:
    """Run the selected passes on ``model`` with onnx_ir's pass manager (once, in order).

    Raises:
        RewriteError: A pass failed (or its precondition did); names the pass and the passes
            that ran before it, and chains the pass's own error.
    """
    steps = [_Step(name, step) for name, step in selected_passes(inputs)]
    log.debug("passes: %s", ", ".join(map(str, steps)))
    try:
        return ir.passes.PassManager(steps, steps=1)(model)
    except ir.passes.PassError as e:
        inner: BaseException = e
        while type(inner) is ir.passes.PassError and isinstance(inner.__cause__, Exception):
            inner = inner.__cause__  # the manager's wrappers, down to the pass's own error
        failed = next(i for i, step in enumerate(steps) if step.failed)
        ran = [str(step) for step in steps[:failed]]
        raise RewriteError(
            f"rewrite pass {str(steps[failed])!r} failed (after {ran}): {inner}"
        ) from inner


class _Step(ir.passes.PassBase):
    """A pass of the list under its entry's name, so that logs and errors read by name."""

    def __init__(self, name: str, inner: ir.passes.PassBase) -> None:
        self.name = name
        self.inner = inner
        self.failed = False

    @property
    def in_place(self) -> bool:
        return self.inner.in_place

    @property
    def changes_input(self) -> bool:
        return self.inner.changes_input

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        try:
            return self.inner(model)
        except Exception:
            self.failed = True
            raise

    def __str__(self) -> str:
        return self.name


def load_units(bundle_dir: Path, bundle: ExportBundle) -> dict[str, ir.Model]:
    """Every unit's exported model by unit name, initializers no longer listed as inputs."""
    units = {u.name: load_model(bundle_dir / UNITS_DIR / f"{u.name}.onnx") for u in bundle.units}
    for unit_model in units.values():
        # Per-type units are exported with initializers as graph inputs (see torchscript.py).
        graph = unit_model.graph
        for index in reversed(range(len(graph.inputs))):
            if graph.inputs[index].name in graph.initializers:
                graph.inputs.pop(index)
    return units


def compose_model(
    bundle_dir: Path, *, options: ExportOptions, record: CaptureRecord | None = None
) -> tuple[ir.Model, ExportManifest]:
    """Load a bundle's units, splice them into one model with functions, run the rewrites.

    ``record`` defaults to the copy of the capture record that the export wrote into the bundle.
    """
    if record is None:
        record = CaptureRecord.loads((bundle_dir / CAPTURE_RECORD).read_text(encoding="utf-8"))
    bundle = ExportBundle.loads((bundle_dir / BUNDLE_JSON).read_text(encoding="utf-8"))
    units = load_units(bundle_dir, bundle)
    model = units.pop("root")
    run_passes(model, PassInputs(options, bundle, record, units))
    return model, build_manifest(model, bundle, record, options.rewrite.fuse)

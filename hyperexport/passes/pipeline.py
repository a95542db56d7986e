"""Compose an export bundle into the final model: the pass list a recipe selects."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx_ir as ir
from onnx_ir.passes.common import (
    RemoveUnusedFunctionsPass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
    TopologicalSortPass,
)

from hyperexport.contracts.bundle import BUNDLE_JSON, CAPTURE_RECORD, ExportBundle
from hyperexport.contracts.manifest import ExportManifest
from hyperexport.contracts.records import CaptureRecord
from hyperexport.options import ExportOptions
from hyperexport.passes.build_manifest import build_manifest
from hyperexport.passes.compose_functions import ComposeFunctionsPass
from hyperexport.passes.prune_function_io import PruneFunctionIOPass

log = logging.getLogger(__name__)


def rewrite_passes(options: ExportOptions) -> list[ir.passes.PassBase]:
    """The passes that run after composition, in order, as the options select them."""
    steps: list[ir.passes.PassBase] = []
    if options.rewrite.optimize:
        from hyperexport.passes.optimize import OptimizeKeepFunctionsPass

        steps.append(OptimizeKeepFunctionsPass())
    if options.rewrite.fuse_constants:
        from hyperexport.passes.fuse_constants import FuseConstantsIntoFunctionsPass

        steps.append(FuseConstantsIntoFunctionsPass())
    steps.append(PruneFunctionIOPass())
    if options.rewrite.fold_leftovers:
        from hyperexport.passes.fold_leftovers import FoldLeftoversPass

        steps.append(FoldLeftoversPass())
    if options.attention.promote_opset24:
        from hyperexport.passes.promote_attention import PromoteAttentionToOpset24Pass

        steps.append(PromoteAttentionToOpset24Pass())
    steps += [
        RemoveUnusedNodesPass(),
        RemoveUnusedFunctionsPass(),
        RemoveUnusedOpsetsPass(),
        TopologicalSortPass(),
    ]
    return steps


def _specialize_pass(bundle: ExportBundle, record: CaptureRecord) -> ir.passes.PassBase:
    from hyperexport.passes.compose_functions import function_names
    from hyperexport.passes.specialize_instances import SpecializePerInstancePass

    names = function_names(bundle, record)
    units = [u for u in bundle.units if u.call_ids]
    return SpecializePerInstancePass(
        weights={names[u.name]: frozenset(u.weights) for u in units},
        classes={names[u.name]: u.class_name for u in units},
    )


def compose_model(
    bundle_dir: Path, *, options: ExportOptions, record: CaptureRecord | None = None
) -> tuple[ir.Model, ExportManifest]:
    """Load a bundle's units, splice them into one model with functions, run the rewrites.

    ``record`` defaults to the copy of the capture record that the export wrote into the bundle.
    """
    if record is None:
        record = CaptureRecord.loads((bundle_dir / CAPTURE_RECORD).read_text(encoding="utf-8"))
    bundle = ExportBundle.loads((bundle_dir / BUNDLE_JSON).read_text(encoding="utf-8"))
    units = {u.name: ir.load(bundle_dir / "units" / f"{u.name}.onnx") for u in bundle.units}
    for unit_model in units.values():
        # Per-type units are exported with initializers as graph inputs (see torchscript.py).
        graph = unit_model.graph
        for index in reversed(range(len(graph.inputs))):
            if graph.inputs[index].name in graph.initializers:
                graph.inputs.pop(index)
    model = units.pop("root")
    ComposeFunctionsPass(units, bundle, record)(model)
    steps = rewrite_passes(options)
    if bundle.function_mode == "per_instance":
        steps.insert(0, _specialize_pass(bundle, record))
    ir.passes.PassManager(steps)(model)
    return model, build_manifest(model, bundle, record)

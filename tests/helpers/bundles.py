"""Export bundles of the toy hierarchy, for the tests of what composes them."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from hyperexport.base.contracts.bundle import ExportBundle
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.library.capture.capture_model import capture_model
from hyperexport.library.export.units import export_units
from hyperexport.library.options import ExportOptions
from hyperexport.library.passes.pipeline import load_units
from tests.helpers.opsets import TEST_OPSET
from tests.helpers.toys import Block, Leaf, toy_inputs, toy_net


def export_toy_bundle(out_dir: Path, mode: str) -> tuple[ExportBundle, CaptureRecord]:
    """Export the toy hierarchy (hiera Block and Leaf) into a bundle on the TorchScript path."""
    model, args = toy_net(), toy_inputs()
    capture = capture_model(model, args, hiera=[Block, Leaf])
    options = ExportOptions(functions=mode)  # type: ignore[arg-type]
    bundle = export_units(
        model, capture, opset=TEST_OPSET, dynamo=False, options=options, out_dir=out_dir
    )
    return bundle, capture.record


def load_root_and_units(
    bundle_dir: Path, bundle: ExportBundle
) -> tuple[ir.Model, dict[str, ir.Model]]:
    """Fresh models of the bundle: the root, and the other units by name."""
    units = load_units(bundle_dir, bundle)
    return units.pop("root"), units

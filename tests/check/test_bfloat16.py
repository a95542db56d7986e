"""bfloat16 tensors are stored as uint16 bits; the check feeds and fetches them as bfloat16."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest

from hyperexport.check import CheckSettings, run_checks
from hyperexport.check.tensors import CapturedArrays
from hyperexport.contracts.manifest import FUNCTION_DOMAIN as FN
from hyperexport.contracts.manifest import META_EXPORT_PATH, CallSite, ExportManifest, FunctionEntry
from hyperexport.contracts.records import CaptureRecord, ModuleCall, TensorMeta
from hyperexport.errors import CheckError

TEXT = f"""
<ir_version: 10, opset_import: ["": 18, "{FN}": 1]>
g (bfloat16[3] x) => (bfloat16[3] y) {{
  y = {FN}.Double(x)
}}
<domain: "{FN}", opset_import: ["": 18]>
Double (x) => (y) {{
  f = Cast <to = 1> (x)
  d = Add(f, f)
  y = Cast <to = 16> (d)
}}
"""


def _setup(tmp_path: Path, scale: float) -> tuple[Path, ExportManifest, CaptureRecord, dict]:
    model = ir.from_proto(onnx.parser.parse_model(TEXT))
    model.metadata_props[META_EXPORT_PATH] = "dynamo=False"
    path = tmp_path / "bf16.onnx"
    ir.save(model, path)
    x = np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16)
    y = (x.astype(np.float32) * scale).astype(ml_dtypes.bfloat16)
    arrays = {
        k: v.view(np.uint16)
        for k, v in {"in.0": x, "out.0": y, "d#0/in.0": x, "d#0/out.0": y}.items()
    }
    tensors = tuple(TensorMeta(k, (3,), "bfloat16") for k in sorted(arrays))
    call = ModuleCall(
        "d",
        "toy.Double",
        0,
        0,
        None,
        ("dict", (("x", ("tensor", "d#0/in.0")),)),
        ("tensor", "d#0/out.0"),
    )
    capture = CaptureRecord(
        "toy.M", ("dict", ()), ("tensor", "out.0"), (call,), tensors, ("toy.Double",)
    )
    manifest = ExportManifest(
        dynamo=False,
        opset=18,
        function_mode="per_instance",
        graph_inputs=("in.0",),
        graph_outputs=("out.0",),
        functions=(FunctionEntry(FN, "Double", "toy.Double", ("d",)),),
        calls=(CallSite("d#0", "d", FN, "Double", ("d#0/in.0",), (), ("d#0/out.0",)),),
    )
    return path, manifest, capture, arrays


@pytest.mark.parametrize(("scale", "ok"), [(2.0, True), (3.0, False)])
def test_bfloat16_model_is_checked_end_to_end_and_per_function(
    tmp_path: Path, scale: float, ok: bool
) -> None:
    path, manifest, capture, arrays = _setup(tmp_path, scale)
    report = run_checks(path, manifest, capture, arrays, CheckSettings())
    assert report.end_to_end_error is None
    assert report.ok is ok, report.summary_lines()
    assert report.functions[0].ok is ok
    if not ok:
        assert report.first_divergent_module == "d"
        assert report.outputs[0].max_abs == pytest.approx(2.0)  # |-2 * 2 - -2 * 3|


def test_bfloat16_stored_other_than_as_bits_is_rejected(tmp_path: Path) -> None:
    _, _, capture, arrays = _setup(tmp_path, 2.0)
    captured = CapturedArrays(capture, {**arrays, "in.0": np.zeros(3, np.float32)})
    assert captured.get("out.0").dtype == ml_dtypes.bfloat16
    with pytest.raises(CheckError, match="stored as float32, not uint16 bits"):
        captured.get("in.0")
    with pytest.raises(CheckError, match="no tensor 'nope'"):
        captured.get("nope")

"""bfloat16 tensors are stored as uint16 bits; the check feeds and fetches them as bfloat16."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx.parser
import onnx_ir as ir
import pytest

from hyperexport.base.contracts.manifest import FUNCTION_DOMAIN as FN
from hyperexport.base.contracts.manifest import (
    META_EXPORT_PATH,
    CallSite,
    ExportManifest,
    FunctionEntry,
)
from hyperexport.base.contracts.records import CaptureRecord, ModuleCall, TensorMeta
from hyperexport.base.errors import CheckError
from hyperexport.library.check import CheckSettings, run_checks
from hyperexport.library.check.tensors import CapturedArrays
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH

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


# --- Real exports in low precision: each function runs upcast to float32 (check/upcast.py). ---

# The dynamo path only: torch 2.13's TorchScript exporter makes type-inconsistent graphs of
# fp16/bf16 Llama layers (a plain torch.onnx.export(dynamo=False) of them fails outright), so
# onnx.checker refuses the result even where ONNX Runtime's upcast run matches torch.
LOW_PRECISION_CASES = [
    pytest.param("bfloat16", "per_type", id="bf16-per_type"),
    pytest.param("bfloat16", "per_instance", id="bf16-per_instance"),
    pytest.param("float16", "per_instance", id="fp16-per_instance"),
    pytest.param("float16", "per_type", id="fp16-per_type"),
]


def _export_low_precision(  # type: ignore[no-untyped-def]
    tmp_path: Path, dtype: str, mode: str, dynamo: bool = True, layers: int = 2
):
    torch = pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from hyperexport import ExportOptions, zoo
    from hyperexport.library.api import capture_model, export_hyper_onnx

    model = zoo.tiny_llama(num_layers=layers).to(getattr(torch, dtype))
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    path = tmp_path / "model.onnx"
    manifest = export_hyper_onnx(
        model,
        (ids,),
        path,
        hiera=[LlamaDecoderLayer],
        dynamo=dynamo,
        external_data=True,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
    )
    capture = capture_model(model, (ids,), hiera=[LlamaDecoderLayer], dynamo=dynamo)
    return path, manifest, capture


@NEEDS_DYNAMO_PATH  # exported on the dynamo path
@pytest.mark.parametrize(("dtype", "mode"), LOW_PRECISION_CASES)
def test_low_precision_exports_are_checked_upcast(tmp_path: Path, dtype: str, mode: str) -> None:
    path, manifest, capture = _export_low_precision(tmp_path, dtype, mode)
    report = run_checks(path, manifest, capture.record, capture.arrays, CheckSettings())
    assert report.ok, report.summary_lines()
    assert report.end_to_end_skipped is None
    assert [o.ok for o in report.outputs] == [True]
    assert len(report.functions) == 2 and all(f.max_abs is not None for f in report.functions)


@NEEDS_DYNAMO_PATH  # exported on the dynamo path
def test_a_broken_bfloat16_weight_is_found_in_its_layer(tmp_path: Path) -> None:
    path, manifest, capture = _export_low_precision(tmp_path, "bfloat16", "per_type")
    model = ir.load(path)
    name = next(w for w in manifest.calls[1].weight_inputs if w.endswith("mlp.down_proj.weight"))
    value = model.graph.initializers[name]
    assert value.const_value is not None
    shifted = (value.const_value.numpy().astype(np.float32) + 0.5).astype(ml_dtypes.bfloat16)
    value.const_value = ir.tensor(shifted, name=name)
    broken = path.with_name("broken.onnx")
    ir.save(model, broken, external_data="broken.onnx.data")
    report = run_checks(broken, manifest, capture.record, capture.arrays, CheckSettings())
    assert not report.ok
    assert report.first_divergent_module == manifest.calls[1].module_path


@NEEDS_DYNAMO_PATH  # exported on the dynamo path
def test_without_memory_for_the_whole_model_the_comparison_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hyperexport.library import meminfo

    path, manifest, capture = _export_low_precision(tmp_path, "bfloat16", "per_instance")
    monkeypatch.setattr(meminfo, "available_memory", lambda: 1 << 20)
    report = run_checks(path, manifest, capture.record, capture.arrays, CheckSettings())
    assert report.end_to_end_skipped is not None and "GiB available" in report.end_to_end_skipped
    assert report.outputs == ()
    assert len(report.functions) == 2 and report.ok  # every function checked instead
    assert any("end-to-end: SKIPPED" in line for line in report.summary_lines())
    assert report.to_json()["end_to_end"]["skipped"] == report.end_to_end_skipped

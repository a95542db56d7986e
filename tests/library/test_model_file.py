"""Every model file is written at the lowest IR version that carries its opsets, and only that
field differs from what the model said (``model_file.stamped_proto``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hyperexport.library.model_file import save_compact, save_model

MODEL = """
<ir_version: 10, opset_import: ["" : {opset}, "hyperexport.fn" : 1]>
g (float[2, 4] x) => (float[2, 4] y) {{
    y = hyperexport.fn.Block (x)
}}
<domain: "hyperexport.fn", opset_import: ["" : {opset}]>
Block (a) => (b) {{
    w = Constant <value = float[4, 4] w {{{weights}}}> ()
    m = MatMul (a, w)
    b = Relu (m)
}}
"""


def _model(opset: int) -> ir.Model:
    weights = ", ".join(str(float(v)) for v in np.arange(16) / 16)
    return ir.from_proto(onnx.parser.parse_model(MODEL.format(opset=opset, weights=weights)))


def _old_bytes(model: ir.Model, ir_version: int) -> bytes:
    """What saving wrote before: the model's protobuf as it stands, its IR field replaced."""
    proto = ir.to_proto(model)
    proto.ir_version = ir_version
    return proto.SerializeToString()


@pytest.mark.parametrize(("opset", "expected"), [(17, 8), (18, 8), (19, 9), (21, 10), (24, 12)])
@pytest.mark.parametrize("external_data", [False, True])
def test_only_the_ir_version_changes(
    tmp_path: Path, opset: int, expected: int, external_data: bool
) -> None:
    model = _model(opset)
    path = tmp_path / "model.onnx"
    save_model(model, path, external_data=external_data, threshold=16)
    written = path.read_bytes()
    assert onnx.load_from_string(written).ir_version == expected
    assert model.ir_version == 10  # the caller's model keeps its own
    if not external_data:  # the same protobuf but for the one field
        assert written == _old_bytes(model, expected)
        assert written != _old_bytes(model, 10) or expected == 10
    onnx.checker.check_model(str(path), full_check=True)


def test_the_quantize_stages_save_writes_the_lowest_ir_version_too(tmp_path: Path) -> None:
    model = _model(18)
    model.opset_imports["com.microsoft"] = 1
    save_compact(model, tmp_path / "q.onnx", external_data=True, threshold=16)
    loaded = onnx.load(str(tmp_path / "q.onnx"))
    assert loaded.ir_version == 8
    assert (tmp_path / "q.onnx.data").exists()


def test_a_function_opset_above_the_models_counts(tmp_path: Path) -> None:
    model = _model(18)
    model.functions[("hyperexport.fn", "Block", "")].opset_imports[""] = 21
    save_model(model, tmp_path / "m.onnx", external_data=False)
    assert onnx.load(str(tmp_path / "m.onnx")).ir_version == 10

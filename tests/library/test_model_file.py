"""Every model file is written at the lowest IR version that carries its opsets, and only that
field differs from what the model said (``model_file.stamped_proto``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from hyperexport.library.model_file import load_model, save_compact, save_model

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


def _weights_model(tmp_path: Path) -> tuple[ir.Model, Path]:
    """``y = x + sum(w0..w3)``, four 1 KiB initializers, saved with all of them external."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[256] x) => (float[256] y) {
        s = Sum (w0, w1, w2, w3)
        y = Add (x, s)
    }
    """
    proto = onnx.parser.parse_model(text)
    for i in range(4):
        array = np.full(256, i + 1, dtype=np.float32)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array, f"w{i}"))
    path = tmp_path / "export" / "model.onnx"
    path.parent.mkdir()
    ir.save(ir.from_proto(proto), path, external_data="model.onnx.data", size_threshold_bytes=0)
    return ir.load(path), path


def _run(path: Path) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.zeros(256, np.float32)})[0]


@pytest.mark.parametrize("replaced", [0, 3])
def test_a_data_file_mostly_replaced_by_the_passes_is_written_afresh(
    tmp_path: Path, replaced: int
) -> None:
    """What a pass made is appended to a clone of the export's data file, unless the model
    reads less than 90% of that file: then only what it reads is written, into a fresh file."""
    model, source = _weights_model(tmp_path)
    graph = model.graph
    # a pass packs the first `replaced` weights into one new tensor (here: their sum), or, with
    # none replaced, adds one tensor of zeros
    olds = [graph.initializers[f"w{i}"] for i in range(replaced)]
    made = sum((o.const_value.numpy() for o in olds), np.zeros(256, np.float32))  # type: ignore[union-attr]
    new = ir.Value(name="made", const_value=ir.tensor(made, name="made"))
    new.type, new.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([256])
    graph.register_initializer(new)
    [total, _] = list(graph)
    kept = [v for v in total.inputs if v not in olds]
    total.resize_inputs(len(kept) + 1)
    for i, value in enumerate([new, *kept]):
        total.replace_input_with(i, value)
    for old in olds:
        del graph.initializers[old.name]  # type: ignore[arg-type]
    out = tmp_path / "out" / "model.onnx"
    save_model(model, out, external_data=True, threshold=16)
    written = (out.parent / "model.onnx.data").read_bytes()
    exported = (source.parent / "model.onnx.data").read_bytes()
    if replaced:  # a quarter of the export's file read: a fresh file of the two tensors read
        assert 2 * 1024 <= len(written) < 2 * 1024 + 64
    else:  # all of it read: the export's file cloned, the new tensor appended
        assert written[: len(exported)] == exported and len(written) > len(exported)
    np.testing.assert_array_equal(_run(out), _run(source))


def test_a_functions_external_constant_is_read_from_the_models_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_model``: a per_instance function's ``Constant`` saved as external data is read
    from beside the model, wherever the process runs (``ir.load`` alone leaves function bodies'
    external tensors relative to the working directory)."""
    model = _model(18)
    path = tmp_path / "saved" / "model.onnx"
    path.parent.mkdir()
    save_model(model, path, external_data=True, threshold=16)
    assert (path.parent / "model.onnx.data").stat().st_size >= 64  # the 4x4 weight, external
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_model(path)
    [constant] = [
        n for n in loaded.functions[("hyperexport.fn", "Block", "")] if n.op_type == "Constant"
    ]
    weights = constant.attributes["value"].as_tensor()
    assert isinstance(weights, ir.ExternalTensor)
    np.testing.assert_array_equal(weights.numpy().reshape(-1), np.arange(16) / 16)


def test_the_compact_save_rewrites_a_main_graph_constant_held_in_external_data(
    tmp_path: Path,
) -> None:
    """``save_compact`` (the quantize stage's save) puts every tensor it writes into its own data
    file, a main-graph ``Constant``'s too (``ir.save`` moves only initializers, and left the
    ``Constant`` pointing into the data file of the model it was loaded from)."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[256] x) => (float[256] y) {
        c = Constant <value = float[256] c {0.0}> ()
        y = Add (x, c)
    }
    """
    proto = onnx.parser.parse_model(text)
    table = np.linspace(0, 1, 256, dtype=np.float32)
    proto.graph.node[0].attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(table, "c"))
    source = tmp_path / "float" / "model.onnx"
    source.parent.mkdir()
    save_model(ir.from_proto(proto), source, external_data=True, threshold=16)
    model = load_model(source)
    [constant] = list(model.graph)[:1]
    assert isinstance(constant.attributes["value"].as_tensor(), ir.ExternalTensor)
    target = tmp_path / "quantized" / "q.onnx"
    target.parent.mkdir()
    save_compact(model, target, external_data=True, threshold=16)
    written = onnx.load(str(target), load_external_data=False)
    [t] = [a.t for a in written.graph.node[0].attribute]
    assert {e.key: e.value for e in t.external_data}["location"] == "q.onnx.data"
    (source.parent / "model.onnx.data").unlink()  # the quantized folder stands alone
    np.testing.assert_array_equal(_run(target), table)

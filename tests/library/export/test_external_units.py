"""Issue 12: weights are written once, as external data, and flow as references to the end.

No test builds 2 GB: the properties that keep a large model within the protobuf limit and its
memory near the weights' size are checked on a small one. The unit files carry no weight bytes
(every tensor over the inline limit is a reference into ``units/weights.data``), each distinct
weight is written once, the final data file is that same file (cloned), and per-instance
functions reference their weights as external data. The protobuf limit itself is lowered
in a test to show that ``external_data=False`` is refused before anything is written.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

from hyperexport import ExportOptions, export_hyper_onnx, zoo
from hyperexport.base.errors import ResourceError
from hyperexport.library import export_budget, model_file
from hyperexport.library.api import capture_model, compose_model, export_units, save_model
from hyperexport.library.export.weights import INLINE_LIMIT, WEIGHTS_FILE
from tests.helpers.driver_process import private_mounts_refusal, run_in_private_mounts
from tests.helpers.opsets import TEST_OPSET

PATHS = [pytest.param(False, id="torchscript"), pytest.param(True, id="dynamo")]
MODES = ["per_type", "per_instance"]


def _model() -> torch.nn.Module:
    # hidden 64, vocab 128: every projection is at least INLINE_LIMIT bytes.
    return zoo.tiny_llama(num_layers=3)


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))


def _large_state(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameters and buffers at or over the inline limit."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes >= INLINE_LIMIT:
            seen[tensor.untyped_storage().data_ptr()] = nbytes
    return sum(seen.values())


def _all_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Initializers, and tensor attributes of every node of the graph and the functions."""
    tensors = list(proto.graph.initializer)
    nodes = [*proto.graph.node, *(n for f in proto.functions for n in f.node)]
    tensors += [a.t for n in nodes for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    return tensors


def _external(tensor: onnx.TensorProto) -> dict[str, str] | None:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in tensor.external_data}


@pytest.mark.parametrize("dynamo", PATHS)
def test_units_hold_references_and_each_weight_is_written_once(
    tmp_path: Path, dynamo: bool
) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = _model()
    capture = capture_model(model, (_ids(),), hiera=[LlamaDecoderLayer], dynamo=dynamo)
    options = ExportOptions(functions="per_type")
    export_units(model, capture, opset=TEST_OPSET, dynamo=dynamo, options=options, out_dir=tmp_path)
    units = tmp_path / "units"
    data = units / WEIGHTS_FILE
    # Every weight once: the layers' weights are inputs of the root's placeholders *and*
    # initializers of the layer body, and they are not written twice.
    assert _large_state(model) <= data.stat().st_size < _large_state(model) + 65536 * 4
    inline = 0
    for path in units.glob("*.onnx"):
        proto = onnx.load(path, load_external_data=False)
        for tensor in proto.graph.initializer:
            size = len(tensor.raw_data)
            assert size < INLINE_LIMIT, f"{path.name}: {tensor.name} holds {size} bytes"
            inline += size
    assert inline < _large_state(model) / 20


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dynamo", PATHS)
def test_the_final_data_file_is_the_export_weight_file(
    tmp_path: Path, dynamo: bool, mode: str
) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model, ids = _model(), _ids()
    capture = capture_model(model, (ids,), hiera=[LlamaDecoderLayer], dynamo=dynamo)
    options = ExportOptions(functions=mode)  # type: ignore[arg-type]
    bundle = tmp_path / "bundle"
    export_units(model, capture, opset=TEST_OPSET, dynamo=dynamo, options=options, out_dir=bundle)
    composed, _ = compose_model(bundle, options=options, record=capture.record)
    out = tmp_path / "out" / "model.onnx"
    save_model(composed, out, external_data=True, threshold=INLINE_LIMIT)

    weights = (bundle / "units" / WEIGHTS_FILE).read_bytes()
    assert (tmp_path / "out" / "model.onnx.data").read_bytes() == weights  # cloned, not rewritten
    proto = onnx.load(out, load_external_data=False)
    external = [t for t in _all_tensors(proto) if _external(t)]
    assert external and all(_external(t)["location"] == "model.onnx.data" for t in external)
    assert all(len(t.raw_data) < INLINE_LIMIT for t in _all_tensors(proto))
    if mode == "per_instance":
        # Per-instance functions reference their weights as external data (Constant values).
        constants = [
            a.t
            for f in proto.functions
            for n in f.node
            if n.op_type == "Constant"
            for a in n.attribute
            if a.type == onnx.AttributeProto.TENSOR and _external(a.t)
        ]
        assert len(constants) >= 3 * 7  # q, k, v, o, gate, up, down of each layer
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    want = model(input_ids=ids).last_hidden_state.detach().numpy()
    np.testing.assert_allclose(actual, want, atol=1e-4)


def test_the_library_moves_its_temporary_weight_file_into_place(tmp_path: Path) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model, ids = _model(), _ids()
    out = tmp_path / "model.onnx"
    export_hyper_onnx(
        model, (ids,), out, hiera=[LlamaDecoderLayer], dynamo=False, external_data=True
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert _large_state(model) <= (tmp_path / "model.onnx.data").stat().st_size
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    np.testing.assert_allclose(actual, model(input_ids=ids).last_hidden_state.detach(), atol=1e-4)


def test_without_external_data_a_model_over_the_protobuf_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model, ids = _model(), _ids()
    monkeypatch.setattr(model_file, "PROTOBUF_LIMIT", _large_state(model) // 2)
    out = tmp_path / "model.onnx"
    with pytest.raises(ResourceError, match="external_data=True"):
        export_hyper_onnx(
            model, (ids,), out, hiera=[LlamaDecoderLayer], dynamo=False, external_data=False
        )
    assert not out.exists()
    # Under the limit the same model is written as one protobuf, weights inside.
    monkeypatch.setattr(model_file, "PROTOBUF_LIMIT", 2**31)
    export_hyper_onnx(
        model, (ids,), out, hiera=[LlamaDecoderLayer], dynamo=False, external_data=False
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert out.stat().st_size > _large_state(model)


def test_the_shape_inference_patch_is_restored() -> None:
    from hyperexport.library.export.torch_exporter import weights_out_of_shape_inference

    original = torch._C._jit_pass_onnx_graph_shape_type_inference
    with weights_out_of_shape_inference():
        assert torch._C._jit_pass_onnx_graph_shape_type_inference is not original
    assert torch._C._jit_pass_onnx_graph_shape_type_inference is original


def test_an_export_that_cannot_fit_in_memory_is_refused_first_with_the_option() -> None:
    gib = 2**30
    with pytest.raises(ResourceError, match=r"about 4\.\d GiB.*external_data=True lowers it"):
        export_budget.check_export_budget(19 * gib // 10, external_data=False, available=4 * gib)
    with pytest.raises(ResourceError, match="free memory"):
        export_budget.check_export_budget(20 * gib, external_data=True, available=4 * gib)
    export_budget.check_export_budget(10 * gib, external_data=True, available=4 * gib)  # fits


_EXPORT_ON_A_SMALL_DISK = """
import errno, sys, torch
from hyperexport import export_hyper_onnx, zoo
model = zoo.tiny_llama(num_layers=1, vocab_size=16384)  # 4 MiB of embeddings
ids = torch.randint(0, 128, (1, 4))
try:
    export_hyper_onnx(model, (ids,), sys.argv[1] + "/m.onnx", hiera=[type(model.layers[0])],
                      dynamo=False, external_data=True)
except OSError as e:
    print(e.errno == errno.ENOSPC, e.filename.startswith(sys.argv[1]), e.strerror)
"""


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_an_export_that_cannot_fit_on_its_disk_is_refused_before_the_first_weight(
    tmp_path: Path,
) -> None:
    """On a real 2 MiB filesystem (tmpfs, in a private mount namespace), 4 MiB of weights."""
    import sys

    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        f"mount -t tmpfs -o size=2m tmpfs {disk} && "
        f"{sys.executable} -c '{_EXPORT_ON_A_SMALL_DISK}' {disk} && ls -A {disk}"
    )
    run = run_in_private_mounts(script, timeout=300)
    lines = run.stdout.splitlines()
    assert lines == [
        "True True the export writes about 4.1 MiB (the 4.1 MiB of weights), 2.0 MiB is free"
    ], run.stdout + run.stderr  # and ls lists nothing: no file was left behind


def _weights_model(folder: Path, extra: np.ndarray | None = None) -> ir.Model:
    """``y = x @ W (+ B)``: W in ``folder/weights.data`` (external), B (if given) in memory."""
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    (folder / "weights.data").write_bytes(w.tobytes())
    x = ir.Value(name="x", shape=ir.Shape([1, 64]), type=ir.TensorType(ir.DataType.FLOAT))
    weight = ir.Value(
        name="W",
        const_value=ir.ExternalTensor(
            "weights.data",
            0,
            w.nbytes,
            ir.DataType.FLOAT,
            shape=ir.Shape([64, 64]),
            name="W",
            base_dir=os.fspath(folder),
        ),
    )
    initializers = [weight]
    node = ir.node("MatMul", [x, weight])
    nodes = [node]
    out = node.outputs[0]
    if extra is not None:
        bias = ir.Value(name="B", const_value=ir.tensor(extra, name="B"))
        initializers.append(bias)
        nodes.append(ir.node("Add", [out, bias]))
        out = nodes[-1].outputs[0]
    out.name = "y"
    graph = ir.Graph([x], [out], nodes=nodes, initializers=initializers, opset_imports={"": 18})
    return ir.Model(graph, ir_version=10)


def test_link_unchanged_makes_the_data_file_a_link_to_the_weights(tmp_path: Path) -> None:
    """The build's rewrite stage: nothing appended, so the data file links to the export's."""
    bundle = tmp_path / "units"
    bundle.mkdir()
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    save_model(_weights_model(bundle), out, external_data=True, link_unchanged=True)
    data = out.parent / "model.onnx.data"
    assert data.is_symlink() and os.readlink(data) == str((bundle / "weights.data").resolve())
    proto = onnx.load(out, load_external_data=False)
    assert _external(proto.graph.initializer[0])["location"] == "model.onnx.data"


def test_appended_tensors_copy_the_weights_first_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "units"
    bundle.mkdir()
    out = tmp_path / "model.onnx"
    # No reflinks: the clone is a copy (as on ext4 and tmpfs).
    monkeypatch.setattr(model_file, "clone_or_copy", _plain_copy)
    model = _weights_model(bundle, extra=np.ones((8, 64), np.float32))  # 2048 bytes, in memory
    with caplog.at_level(logging.INFO, logger="hyperexport.library.model_file"):
        save_model(model, out, external_data=True, threshold=1024, link_unchanged=True)
    data = tmp_path / "model.onnx.data"
    assert not data.is_symlink()
    weights = (bundle / "weights.data").read_bytes()
    assert data.read_bytes()[: len(weights)] == weights and data.stat().st_size > len(weights)
    assert "copied the export's weight file (0.00 GB) to append 1 tensors (2048 bytes)" in (
        caplog.text
    )


def test_a_tensor_kept_in_the_model_file_leaves_the_weights_linked(tmp_path: Path) -> None:
    """A pass's constant marked ``keep_in_model_file`` (the rotary tables, 33 MB at the 1B
    shape) is written into the protobuf however large, so nothing is appended and the data file
    stays a link to the export's weights."""
    bundle = tmp_path / "units"
    bundle.mkdir()
    out = tmp_path / "model.onnx"
    model = _weights_model(bundle, extra=np.ones((8, 64), np.float32))  # 2048 bytes, in memory
    bias = model.graph.initializers["B"].const_value
    assert bias is not None
    model_file.keep_in_model_file(bias)
    save_model(model, out, external_data=True, threshold=1024, link_unchanged=True)
    data = tmp_path / "model.onnx.data"
    assert data.is_symlink() and os.readlink(data) == str((bundle / "weights.data").resolve())
    proto = onnx.load(out, load_external_data=False)
    kept = {t.name: t for t in proto.graph.initializer}["B"]
    assert _external(kept) is None and len(kept.raw_data) == 2048


def _plain_copy(src: Path, dst: Path) -> str:
    shutil.copyfile(src, dst)
    return "copy"


@pytest.mark.parametrize("allowed", [True, False])
def test_take_moves_the_weights_to_append_when_allowed(tmp_path: Path, allowed: bool) -> None:
    """The build's rewrite stage: the export's weights taken over (moved, then appended to)
    when no later stage reads them, else cloned; either way the origin names that file."""
    bundle = tmp_path / "units"
    bundle.mkdir()
    out = tmp_path / "model.onnx"
    model = _weights_model(bundle, extra=np.ones((8, 64), np.float32))
    weights = bundle / "weights.data"
    before, inode = weights.read_bytes(), weights.stat().st_ino
    asked: list[Path] = []

    def take(path: Path) -> bool:
        asked.append(path)
        return allowed

    origin = save_model(
        model, out, external_data=True, threshold=1024, link_unchanged=True, take=take
    )
    data = tmp_path / "model.onnx.data"
    assert [os.path.realpath(p) for p in asked] == [os.path.realpath(weights)]
    assert weights.exists() is not allowed
    assert (data.stat().st_ino == inode) is allowed  # moved, not copied
    assert data.read_bytes()[: len(before)] == before and data.stat().st_size > len(before)
    assert origin is not None
    assert (origin.cloned, origin.cloned_bytes) == (os.path.realpath(weights), len(before))
    proto = onnx.load(out)  # the appended tensor and the weights, all readable
    assert {i.name for i in proto.graph.initializer} == {"W", "B"}

"""Why the engine's workspace copies checkouts instead of linking them to blobs: the model
readers the product's stages use refuse external data that is a symlink out of the model's
folder (engine/workspace.py; ARCHITECTURE's "A model's data twice at most")."""

from __future__ import annotations

import importlib.metadata as metadata
import os
from pathlib import Path

import pytest
from packaging.version import Version


def test_why_checkouts_are_not_symlinks_to_blobs(tmp_path: Path) -> None:
    """The reason the workspace copies instead of linking to the blob: onnx's checker (from 1.23),
    onnx-ir (from 0.2.1) and onnxruntime (1.31, its floor, and later) refuse external data that
    is a symlink out of the model's folder; older onnx and onnx-ir (their floors) read it. The
    model is IR version 10: onnxruntime 1.31 reads no later one (onnx 1.23 writes 14). If the newest
    releases start reading it again, checkouts could link instead."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    model_dir, blobs = tmp_path / "model", tmp_path / "blobs"
    model_dir.mkdir()
    blobs.mkdir()
    w = np.ones((16, 16), np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(w, "W")],
    )
    path = model_dir / "model.onnx"
    onnx.save_model(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
        path,
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    data = model_dir / "model.onnx.data"
    os.replace(data, blobs / "digest")
    data.symlink_to(blobs / "digest")

    def refuses_from(name: str, release: str) -> bool:
        return Version(metadata.version(name).split("+")[0]) >= Version(release)

    if refuses_from("onnx", "1.23"):
        with pytest.raises(onnx.checker.ValidationError, match="symbolic link"):
            onnx.checker.check_model(str(path), full_check=True)
    else:
        onnx.checker.check_model(str(path), full_check=True)
    if refuses_from("onnx-ir", "0.2.1"):
        with pytest.raises(ValueError, match="symlink"):
            ir.load(path).graph.initializers["W"].const_value.numpy()  # type: ignore[union-attr]
    else:
        read = ir.load(path).graph.initializers["W"].const_value.numpy()  # type: ignore[union-attr]
        assert np.array_equal(read, w)
    with pytest.raises(Exception, match="escapes model directory"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

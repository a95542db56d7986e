"""Sessions over large float weights read them from the data file's pages instead of copying
them (``check/ort_session.py`` ``weights_in_place``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hyperexport.library.check import ort_session

_N = 2048  # one [N, N] float32 weight of 16 MiB, used through a Transpose as an export leaves it


def _model(folder: Path, *, nbits: bool = False) -> Path:
    """``y = x @ Transpose(w)`` with ``w`` in ``model.onnx.data`` (and a ``MatMulNBits`` node
    when ``nbits``)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((_N, _N), dtype=np.float32), "w")
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    inits = [weight]
    if nbits:  # a second output through a 4-bit MatMul of 32-element blocks
        blocks = _N // 32
        codes = numpy_helper.from_array(np.zeros((_N, blocks, 16), np.uint8), "q")
        scales = numpy_helper.from_array(np.ones((_N * blocks,), np.float32), "s")
        inits += [codes, scales]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                ["x", "q", "s"],
                ["z"],
                domain="com.microsoft",
                K=_N,
                N=_N,
                bits=4,
                block_size=32,
            )
        )
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, _N]) for n in ("y", "z")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, _N])],
        outputs[: 1 + nbits],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    path = folder / "model.onnx"
    onnx.save(
        # IR 10: what every supported ONNX Runtime loads (1.31 stops at 13; onnx's default moves)
        helper.make_model(graph, opset_imports=opsets, ir_version=10),
        str(path),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=1024,
    )
    return path


def test_small_weights_keep_the_default_session(tmp_path: Path) -> None:
    assert not ort_session.weights_in_place(_model(tmp_path))


def test_large_float_weights_are_read_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ort_session, "IN_PLACE_MIN_BYTES", 1 << 20)
    assert ort_session.weights_in_place(_model(tmp_path))


def test_a_model_with_matmulnbits_keeps_prepacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ort_session, "IN_PLACE_MIN_BYTES", 1 << 20)
    assert not ort_session.weights_in_place(_model(tmp_path, nbits=True))


_MEASURE = """
import json, sys
from pathlib import Path
import numpy as np
from hyperexport.library.check.ort_session import session_options
import onnxruntime as ort
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
before = anon()
options = session_options(in_place=sys.argv[2] == "1")
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
out = session.run(None, {"x": np.ones((1, int(sys.argv[3])), np.float32)})[0]
print(json.dumps({"grew": anon() - before, "sum": float(out.sum())}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_an_in_place_session_holds_no_copy_of_the_weight(tmp_path: Path) -> None:
    path = _model(tmp_path)

    def measure(in_place: bool) -> dict[str, float]:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(path), "1" if in_place else "0", str(_N)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    weight = _N * _N * 4
    copied, in_place = measure(False), measure(True)
    assert copied["grew"] > weight, copied  # the default session copies the 16 MiB weight
    assert in_place["grew"] < weight / 2, in_place
    assert in_place["sum"] == pytest.approx(copied["sum"], rel=1e-5)

"""``tensor_bytes.write_tensor``: the bytes of external, concatenated and in-memory tensors,
copied inside the kernel where they are in a file, the same bytes as ``tobytes()``."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from hyperexport.library.model_file import save_model
from hyperexport.library.tensor_bytes import ConcatenatedTensor, stacked, write_tensor


def _external(folder: Path, arrays: list[np.ndarray]) -> list[ir.ExternalTensor]:
    """``arrays`` written one after another (odd offsets included) into ``folder/w.data``."""
    tensors, offset = [], 3
    with open(folder / "w.data", "wb") as f:
        f.write(b"\1\2\3")
        for i, array in enumerate(arrays):
            raw = array.tobytes()
            f.write(raw)
            dtype = ir.DataType.from_numpy(array.dtype)
            shape = ir.Shape(array.shape)
            tensors.append(
                ir.ExternalTensor(
                    "w.data", offset, len(raw), dtype, shape=shape, name=f"w{i}", base_dir=folder
                )
            )
            offset += len(raw)
    return tensors


def _written(path: Path, tensors: list[ir.TensorProtocol]) -> bytes:
    with open(path, "wb") as out:
        out.write(b"head")
        for tensor in tensors:
            write_tensor(out, tensor)
        out.write(b"tail")
    return path.read_bytes()


def test_external_concatenated_and_memory_tensors_write_their_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, 8)).astype(np.float32) for n in (8, 4, 4))
    external = _external(tmp_path, [q, k, v])
    packed = ConcatenatedTensor(external, "qkv")
    assert list(packed.shape.numpy()) == [16, 8] and packed.dtype == ir.DataType.FLOAT
    np.testing.assert_array_equal(packed.numpy(), np.concatenate([q, k, v]))
    memory = ir.tensor(np.arange(5, dtype=np.int64), name="m")
    got = _written(tmp_path / "out.data", [external[1], packed, memory])
    expected = b"head" + k.tobytes() + packed.tobytes() + memory.tobytes() + b"tail"
    assert got == expected


def test_a_source_on_another_filesystem_still_writes_the_bytes(tmp_path: Path) -> None:
    """The kernel copy between two filesystems (tmpfs and the test's) may be refused (EXDEV):
    the bytes then go through memory, the same bytes."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's temporary folder")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((64, 32)).astype(np.float32) for _ in range(2)]
    folder = shm / f"hyperexport-test-{os.getpid()}"
    folder.mkdir()
    try:
        tensors = _external(folder, arrays)
        got = _written(tmp_path / "out.data", [ConcatenatedTensor(tensors, "p")])
    finally:
        (folder / "w.data").unlink()
        folder.rmdir()
    assert got == b"head" + np.concatenate(arrays).tobytes() + b"tail"


def test_a_truncated_data_file_is_an_error_not_short_bytes(tmp_path: Path) -> None:
    [tensor] = _external(tmp_path, [np.ones((64, 64), np.float32)])
    with open(tmp_path / "w.data", "r+b") as f:
        f.truncate(1000)
    with open(tmp_path / "out.data", "wb") as out, pytest.raises(OSError) as info:
        write_tensor(out, tensor)
    assert info.value.errno == errno.EIO and "w.data" in str(info.value)


def test_parts_that_do_not_stack_are_refused() -> None:
    a = ir.tensor(np.zeros((2, 3), np.float32), name="a")
    b = ir.tensor(np.zeros((2, 4), np.float32), name="b")
    with pytest.raises(ValueError, match="does not stack"):
        ConcatenatedTensor([a, b], "ab")


def test_a_saved_model_with_a_packed_weight_has_the_lazy_packings_bytes(tmp_path: Path) -> None:
    """The data file saving writes with a concatenated weight is byte for byte the one it wrote
    when the packed weight was computed in memory (``ir.LazyTensor`` over ``np.concatenate``)."""
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal((n, 16)).astype(np.float32) for n in (16, 8, 8)]
    external = _external(tmp_path, arrays)

    def model(weight: ir.TensorProtocol) -> ir.Model:
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 16]))
        w = ir.Value(name="w", const_value=weight)
        w.type, w.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([32, 16])
        node = ir.node("Gemm", [x, w], attributes={"transB": 1})
        graph = ir.Graph([x], node.outputs, nodes=[node], initializers=[w], opset_imports={"": 18})
        return ir.Model(graph, ir_version=8)

    lazy = ir.LazyTensor(
        lambda: ir.tensor(np.concatenate([t.numpy() for t in external]), name="w"),
        dtype=ir.DataType.FLOAT,
        shape=ir.Shape([32, 16]),
        name="w",
    )
    save_model(model(lazy), tmp_path / "a" / "model.onnx", external_data=True, threshold=16)
    packed = ConcatenatedTensor(external, "w")
    save_model(model(packed), tmp_path / "b" / "model.onnx", external_data=True, threshold=16)
    a, b = (tmp_path / d / "model.onnx.data" for d in "ab")
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size >= 32 * 16 * 4


def test_consecutive_ranges_of_one_file_stack_into_one_range(tmp_path: Path) -> None:
    """What the export writes (q, k, v one after another) packs into a range of its file, which
    holds no bytes of its own; anything else stays a concatenation."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, 8)).astype(np.float32) for n in (8, 4, 4))
    external = _external(tmp_path, [q, k, v])
    packed = stacked(external, "qkv")
    assert isinstance(packed, ir.ExternalTensor)
    assert (packed.offset, packed.length) == (3, q.nbytes + k.nbytes + v.nbytes)
    np.testing.assert_array_equal(packed.numpy(), np.concatenate([q, k, v]))
    assert list(packed.shape.numpy()) == [16, 8]
    out_of_order = stacked([external[1], external[0]], "kq")
    assert isinstance(out_of_order, ConcatenatedTensor)
    np.testing.assert_array_equal(out_of_order.numpy(), np.concatenate([k, q]))
    gap = stacked([external[0], external[2]], "qv")  # k lies between them
    assert isinstance(gap, ConcatenatedTensor)
    other = tmp_path / "other"
    other.mkdir()
    [elsewhere] = _external(other, [k])
    assert isinstance(stacked([external[0], elsewhere], "q+k elsewhere"), ConcatenatedTensor)
    memory = ir.tensor(k, name="k")
    assert isinstance(stacked([external[0], memory], "q+k in memory"), ConcatenatedTensor)

"""The weight index read from safetensors headers agrees with safetensors' own reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hyperexport.base.contracts.weight_index import (
    SHARD_INDEX_FILE,
    WeightIndex,
    read_header,
    read_weight_index,
    sha256_file,
)
from hyperexport.base.errors import CorruptRecordError

_ARRAYS = {
    "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "b.bias": np.arange(5, dtype=np.int64),
    "c.scale": np.ones((2, 2, 2), dtype=np.float16),
}


def _write(folder: Path) -> None:
    """Two shards and the shard index transformers writes."""
    save_file({k: _ARRAYS[k] for k in ("a.weight", "b.bias")}, folder / "m-1.safetensors")
    save_file({"c.scale": _ARRAYS["c.scale"]}, folder / "m-2.safetensors")
    weight_map = {"a.weight": "m-1.safetensors", "b.bias": "m-1.safetensors"}
    weight_map["c.scale"] = "m-2.safetensors"
    (folder / SHARD_INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))


def test_offsets_point_at_the_tensors_bytes(tmp_path: Path) -> None:
    _write(tmp_path)
    index = read_weight_index(tmp_path, digest=sha256_file)
    assert set(index.tensors) == set(_ARRAYS)
    for name, stored in index.tensors.items():
        raw = (tmp_path / stored.file).read_bytes()[stored.offset : stored.end]
        expected = load_file(tmp_path / stored.file)[name]
        assert raw == expected.tobytes()
        assert stored.shape == expected.shape
    assert index.files["m-2.safetensors"] == sha256_file(tmp_path / "m-2.safetensors")
    assert index.nbytes() == sum(a.nbytes for a in _ARRAYS.values())
    assert index.layout()[0][1:] in (["F32", [3, 4]], ["I64", [5]])


def test_record_round_trips_and_refuses_edits(tmp_path: Path) -> None:
    _write(tmp_path)
    index = read_weight_index(tmp_path)
    text = index.dumps()
    assert WeightIndex.loads(text) == index and WeightIndex.loads(text).dumps() == text
    data = json.loads(text)
    data["tensors"][0][5] += 2  # a length that no longer matches the shape
    with pytest.raises(CorruptRecordError, match="bytes for"):
        WeightIndex.loads(json.dumps(data))
    data = json.loads(text)
    data["tensors"][0][1] = "elsewhere.safetensors"
    with pytest.raises(CorruptRecordError, match="no listed file"):
        WeightIndex.loads(json.dumps(data))


def test_folder_without_shard_index_reads_every_file(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / SHARD_INDEX_FILE).unlink()
    assert sorted(read_weight_index(tmp_path).files) == ["m-1.safetensors", "m-2.safetensors"]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "huge_length", "not_json", "overlap", "bad_dtype"],
)
def test_malformed_headers_are_refused(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "x.safetensors"
    save_file({"w": np.zeros(4, np.float32), "v": np.zeros(2, np.float32)}, path)
    raw = bytearray(path.read_bytes())
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    if damage == "truncate":
        raw = raw[:5]
    elif damage == "huge_length":
        raw[:8] = (1 << 40).to_bytes(8, "little")
    elif damage == "not_json":
        raw[8] = ord("#")
    else:
        if damage == "overlap":
            start = header["w"]["data_offsets"][0]
            header["v"]["data_offsets"] = [start, start + 8]
        else:
            header["w"]["dtype"] = "Q4"
        body = json.dumps(header, separators=(",", ":")).encode().ljust(length)
        assert len(body) == length
        raw[8 : 8 + length] = body
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError):
        read_header(path, "x.safetensors")


def test_a_tensor_in_two_files_is_refused(tmp_path: Path) -> None:
    save_file({"w": np.zeros(2, np.float32)}, tmp_path / "a.safetensors")
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "b.safetensors")
    with pytest.raises(CorruptRecordError, match=r"is in a\.safetensors and b\.safetensors"):
        read_weight_index(tmp_path)

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hyperexport.engine.store import ActionEntry, CacheStore

KEY = "ab" * 32


def _stage_output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    (out / "units").mkdir(parents=True)
    (out / "a.json").write_text('{"x": 1}')
    (out / "units" / "u.onnx").write_bytes(b"\x00onnx" * 100)
    return out


def test_commit_then_lookup_and_checkout(store: CacheStore, tmp_path: Path) -> None:
    entry = store.commit(KEY, "export", _stage_output(tmp_path))
    assert [f.path for f in entry.outputs] == ["a.json", "units/u.onnx"]
    found = store.lookup(KEY)
    assert found.status == "hit"
    assert found.entry == entry
    dest = tmp_path / "checkout"
    store.checkout(entry, dest)
    assert (dest / "units" / "u.onnx").read_bytes() == b"\x00onnx" * 100
    # The action entry is plain JSON with full-length digests; no temporary files are left.
    data = json.loads(store.action_path(KEY).read_text())
    assert len(data["outputs"][0][1]) == 64
    assert not [p for p in store.root.rglob("*.tmp")]


def test_missing_key_is_a_miss(store: CacheStore) -> None:
    assert store.lookup(KEY).status == "missing"


def test_truncated_blob_is_corrupt_removed_and_a_miss(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = store.commit(KEY, "export", _stage_output(tmp_path))
    blob = store.blob_path(entry.outputs[1].digest)
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.truncate(10)
    with caplog.at_level(logging.WARNING):
        assert store.lookup(KEY).status == "corrupt"
    assert "corrupt" in caplog.text
    assert not store.action_path(KEY).exists()
    assert store.lookup(KEY).status == "missing"


def test_flipped_small_blob_is_detected(store: CacheStore, tmp_path: Path) -> None:
    entry = store.commit(KEY, "export", _stage_output(tmp_path))
    blob = store.blob_path(entry.outputs[0].digest)
    blob.chmod(0o644)
    blob.write_text('{"x": 2}')  # same size, other content
    assert store.lookup(KEY).status == "corrupt"


def test_garbage_entry_is_corrupt(store: CacheStore) -> None:
    path = store.action_path(KEY)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert store.lookup(KEY).status == "corrupt"
    assert not path.exists()


def test_entry_with_escaping_path_is_rejected() -> None:
    data = {"format": 1, "key": KEY, "stage": "x", "outputs": [["../evil", "0" * 64, 1]]}
    with pytest.raises(ValueError):
        ActionEntry.from_json(data)


def test_read_only_store_never_deletes(store: CacheStore, tmp_path: Path) -> None:
    store.commit(KEY, "export", _stage_output(tmp_path))
    store.action_path(KEY).write_text("garbage")
    assert CacheStore(store.root, read_only=True).lookup(KEY).status == "corrupt"
    assert store.action_path(KEY).exists()


def test_copy_blob_verifies_digest(store: CacheStore, tmp_path: Path) -> None:
    entry = store.commit(KEY, "export", _stage_output(tmp_path))
    f = entry.outputs[1]
    blob = store.blob_path(f.digest)
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[0] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        store.copy_blob(f, tmp_path / "copy.onnx")
    assert not (tmp_path / "copy.onnx").exists()

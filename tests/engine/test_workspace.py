"""Commits move files into the cache; a build's checkouts hold a large blob once (workspace.py)."""

from __future__ import annotations

import errno
import importlib.metadata as metadata
import logging
import os
import stat
from pathlib import Path

import pytest
from packaging.version import Version

from hyperexport.engine import workspace as workspace_mod
from hyperexport.engine.store import ActionEntry, CacheStore, CorruptBlobError
from hyperexport.engine.workspace import ONE_COPY_MIN, Workspace

KEY_A, KEY_B = "aa" * 32, "bb" * 32
BIG = os.urandom(ONE_COPY_MIN + 17)


def _out(tmp_path: Path, name: str = "out") -> Path:
    out = tmp_path / name
    (out / "units").mkdir(parents=True)
    (out / "units" / "weights.data").write_bytes(BIG)
    (out / "bundle.json").write_text('{"units": 1}')
    return out


def _regular_copies(root: Path, size: int) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if stat.S_ISREG(os.lstat(p).st_mode) and p.stat().st_size == size
    )


def test_commit_moves_a_file_into_the_blobs_read_only(store: CacheStore, tmp_path: Path) -> None:
    out = _out(tmp_path)
    inode = (out / "units" / "weights.data").stat().st_ino
    entry = store.commit(KEY_A, "export", out)
    (f,) = [f for f in entry.outputs if f.path == "units/weights.data"]
    blob = store.blob_path(f.digest)
    assert blob.stat().st_ino == inode  # moved, not copied
    assert not (out / "units" / "weights.data").exists()
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    # The same bytes committed again: the blob stays, the new file is left to the scratch.
    again = _out(tmp_path, "again")
    store.commit(KEY_B, "export", again)
    assert blob.stat().st_ino == inode
    assert _regular_copies(store.root, len(BIG)) == [blob]


def test_a_symlink_to_a_checked_out_file_is_committed_without_a_copy(
    store: CacheStore, tmp_path: Path
) -> None:
    entry = store.commit(KEY_A, "export", _out(tmp_path))
    with Workspace(store) as ws:
        inputs = ws.checkout("export", entry)
        out = tmp_path / "rewrite-out"
        out.mkdir()
        (out / "model.onnx.data").symlink_to(inputs / "units" / "weights.data")
        committed = store.commit(KEY_B, "rewrite", out, known=ws.digest_of)
    assert committed.digests()["model.onnx.data"] == entry.digests()["units/weights.data"]
    assert committed.outputs[0].size == len(BIG)
    assert len(_regular_copies(store.root / "blobs", len(BIG))) == 1


def test_a_symlink_to_anything_else_is_refused(store: CacheStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(b"x" * 100)
    out = tmp_path / "out"
    out.mkdir()
    (out / "data").symlink_to(elsewhere)
    with Workspace(store) as ws, pytest.raises(ValueError, match="symlink data"):
        store.commit(KEY_A, "rewrite", out, known=ws.digest_of)
    assert not store.action_path(KEY_A).exists()


def test_a_large_blob_is_held_once_and_moved_to_its_latest_checkout(
    store: CacheStore, tmp_path: Path
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    rewrite_out = tmp_path / "r"
    rewrite_out.mkdir()
    (rewrite_out / "model.onnx.data").write_bytes(BIG)
    rewrite = store.commit(KEY_B, "rewrite", rewrite_out)
    with Workspace(store) as ws:
        first = ws.checkout("export", export)
        weights = first / "units" / "weights.data"
        assert stat.S_ISREG(os.lstat(weights).st_mode)
        second = ws.checkout("rewrite", rewrite)
        data = second / "model.onnx.data"
        # One regular copy, in the folder the running stage reads; the old place links to it.
        assert stat.S_ISREG(os.lstat(data).st_mode) and data.read_bytes() == BIG
        assert weights.is_symlink() and weights.read_bytes() == BIG
        assert len(_regular_copies(ws_root(ws), len(BIG))) == 1
        assert (first / "bundle.json").read_text() == '{"units": 1}'  # small: a copy
        assert ws.checkout("export", export) == first  # once per build
    assert list((store.root / "tmp").iterdir()) == []


def ws_root(ws: Workspace) -> Path:
    root = ws._root
    assert root is not None
    return root


def test_a_copy_a_stage_changed_is_not_trusted(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    with Workspace(store) as ws:
        weights = ws.checkout("export", export) / "units" / "weights.data"
        weights.chmod(0o644)
        weights.write_bytes(b"changed" + BIG[7:])
        assert ws.digest_of(weights) is None
        target = tmp_path / "published.data"
        with caplog.at_level(logging.WARNING):
            assert not ws.hand_over(export.digests()["units/weights.data"], target)
        assert "changed after it was checked out" in caplog.text
        assert not target.exists()


def test_hand_over_moves_the_copy_and_gives_it_up_across_filesystems(
    store: CacheStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    digest = export.digests()["units/weights.data"]
    with Workspace(store) as ws:
        weights = ws.checkout("export", export) / "units" / "weights.data"
        inode = weights.stat().st_ino
        target = tmp_path / "published.data"
        assert ws.hand_over(digest, target)
        assert target.stat().st_ino == inode and stat.S_IMODE(target.stat().st_mode) == 0o644
        assert not ws.hand_over(digest, tmp_path / "twice.data")  # handed over once
    with Workspace(store) as ws:
        weights = ws.checkout("export", export) / "units" / "weights.data"

        def exdev(src: object, dst: object) -> None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")

        monkeypatch.setattr(workspace_mod.os, "replace", exdev)
        with caplog.at_level(logging.WARNING):
            assert not ws.hand_over(digest, tmp_path / "other-fs.data")
        monkeypatch.undo()
        assert "copying it from the cache instead" in caplog.text
        assert "Invalid cross-device link" in caplog.text
        assert not os.path.lexists(weights)  # given up: the caller's copy is the only other one


def test_a_corrupt_blob_fails_the_checkout_and_is_removed(
    store: CacheStore, tmp_path: Path
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    blob = store.blob_path(export.digests()["units/weights.data"])
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:
        fh.write(b"\xff" * 8)
    with Workspace(store) as ws, pytest.raises(CorruptBlobError):
        ws.checkout("export", export)
    assert not blob.exists()


def test_an_entry_without_files_checks_out_as_an_empty_folder(store: CacheStore) -> None:
    entry = ActionEntry(key=KEY_A, stage="empty", outputs=())
    with Workspace(store) as ws:
        assert list(ws.checkout("empty", entry).iterdir()) == []


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
    # (engine tests import no product code, so not hyperexport.versions)
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

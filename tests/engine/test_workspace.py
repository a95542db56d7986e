"""Commits move files into the cache; a build's checkouts hold a large blob once (workspace.py)."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from pathlib import Path

import pytest

from hyperexport.engine import store as store_mod
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


def test_a_kept_output_is_copied_into_the_cache_once_and_its_checkout_is_a_move(
    store: CacheStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _out(tmp_path)
    inode = (out / "units" / "weights.data").stat().st_ino
    reads: list[str] = []
    real_sha256_file = store_mod.sha256_file
    monkeypatch.setattr(
        store_mod, "sha256_file", lambda p: reads.append(Path(p).name) or real_sha256_file(p)
    )
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", out, keep=ws)
        digest = entry.digests()["units/weights.data"]
        blob = store.blob_path(digest)
        # The blob is a copy, hashed as it was written: its name is its bytes' digest.
        assert blob.read_bytes() == BIG and hashlib.sha256(BIG).hexdigest() == digest
        assert stat.S_IMODE(blob.stat().st_mode) == 0o444 and blob.stat().st_ino != inode
        assert reads == ["bundle.json"]  # the large file was not read a second time
        assert not (out / "units" / "weights.data").exists()  # taken out of the scratch
        # The next stage's checkout is the stage's own file, moved: no copy, no hash.
        weights = ws.checkout("export", entry) / "units" / "weights.data"
        assert weights.stat().st_ino == inode and weights.read_bytes() == BIG
        assert reads == ["bundle.json"]
        assert ws.digest_of(weights) == digest
        assert not list((store.root / "blobs").glob(".incoming.*"))
    assert list((store.root / "tmp").iterdir()) == []


def test_a_kept_output_a_stage_then_changed_is_copied_from_the_blob_afresh(
    store: CacheStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Workspace(store) as ws:
        entry = store.commit(KEY_A, "export", _out(tmp_path), keep=ws)
        digest = entry.digests()["units/weights.data"]
        kept = Path(ws._held[digest])
        kept.chmod(0o644)
        kept.write_bytes(b"changed" + BIG[7:])
        with caplog.at_level(logging.WARNING):
            weights = ws.checkout("export", entry) / "units" / "weights.data"
        assert "changed after it was checked out" in caplog.text
        assert weights.read_bytes() == BIG


def test_a_blob_already_there_is_reused_and_a_small_file_is_not_kept(
    store: CacheStore, tmp_path: Path
) -> None:
    store.commit(KEY_A, "export", _out(tmp_path))  # the blob is there before the build
    with Workspace(store) as ws:
        out = _out(tmp_path, "again")
        entry = store.commit(KEY_B, "export", out, keep=ws)
        # The blob is reused (the copy dropped); the file is kept for the build.
        assert len(_regular_copies(store.root / "blobs", len(BIG))) == 1
        assert not list((store.root / "blobs").glob(".incoming.*"))
        assert ws.digest_of(Path(ws._held[entry.digests()["units/weights.data"]]))
        # A small file is committed as without a keeper, and not held.
        assert entry.digests()["bundle.json"] not in ws._held
        assert (out / "bundle.json").exists()  # its blob was there: left to the scratch


def test_a_copy_into_the_cache_that_fails_leaves_nothing_and_keeps_the_output(
    store: CacheStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(src: Path, dst: Path) -> tuple[str, str]:
        dst.write_bytes(src.read_bytes()[:1000])  # half written when the disk fills
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(store_mod, "clone_or_copy_hashed", disk_full)
    out = _out(tmp_path)
    with Workspace(store) as ws, pytest.raises(OSError, match="No space left"):
        store.commit(KEY_A, "export", out, keep=ws)
    assert not store.action_path(KEY_A).exists()
    # No temporary file, no blob of the large file (the small one's blob waits for the collector).
    assert not list((store.root / "blobs").rglob(".*.tmp"))
    assert _regular_copies(store.root / "blobs", len(BIG)) == []
    assert (out / "units" / "weights.data").read_bytes() == BIG  # the stage's file is intact


def test_a_checkout_places_only_the_files_its_stage_reads(
    store: CacheStore, tmp_path: Path
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    with Workspace(store) as ws:
        folder = ws.checkout("export", export, ("bundle.json",))
        assert (folder / "bundle.json").is_file()
        assert not (folder / "units").exists()  # the large blob is not copied out
        assert _regular_copies(ws_root(ws), len(BIG)) == []
        # A later reader of every file gets the same folder, with the rest added.
        assert ws.checkout("export", export) == folder
        assert (folder / "units" / "weights.data").read_bytes() == BIG


def test_a_released_copy_is_the_stages_and_still_names_its_digest(
    store: CacheStore, tmp_path: Path
) -> None:
    export = store.commit(KEY_A, "export", _out(tmp_path))
    digest = export.digests()["units/weights.data"]
    with Workspace(store) as ws:
        folder = ws.checkout("export", export)
        weights = folder / "units" / "weights.data"
        assert not ws.release(folder / "bundle.json")  # small: not held, a plain copy
        assert ws.release(weights)
        assert not ws.release(weights)  # once
        assert stat.S_IMODE(weights.stat().st_mode) & stat.S_IWUSR
        moved = tmp_path / "taken.data"
        os.replace(weights, moved)
        with moved.open("ab") as fh:
            fh.write(b"tail")
        assert ws.digest_of(weights) is None  # vouches for no symlink to it
        assert ws.input_digest(weights) == digest  # but names it, as a declared source
        # Nothing is held for the digest any more: publishing copies it from the blob.
        assert not ws.hand_over(digest, tmp_path / "published.data")
    assert store.blob_path(digest).read_bytes() == BIG

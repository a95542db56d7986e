"""``HashedWriter``: the digest it reports is the sha256 of the file it wrote, whatever mix of
writes and kernel copies made it; a copy is compared with the tensor in memory, so a source that
does not hold the tensor's bytes (changed, or too short) leaves the file holding the tensor's
bytes and says so; a copy the kernel refuses (across filesystems) is written from memory."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
import torch

from hyperexport.library.export import hashed_writer
from hyperexport.library.export.hashed_writer import CopyOutcome, HashedWriter


def _source(folder: Path, tensor: torch.Tensor, header: bytes = b"h" * 100) -> tuple[Path, int]:
    path = folder / "source.bin"
    path.write_bytes(header + tensor.view(torch.uint8).numpy().tobytes())
    return path, len(header)


def _tensor(numel: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_digest_is_the_files_over_writes_and_copies(tmp_path: Path) -> None:
    tensor = _tensor(300_000)
    source, at = _source(tmp_path, tensor)
    out = tmp_path / "weights.data"
    with HashedWriter(out) as w:
        w.write(b"\0" * 64)
        assert w.copy(str(source), at, tensor) is CopyOutcome.COPIED
        w.write(memoryview(b"tail"))
    assert out.read_bytes() == b"\0" * 64 + tensor.numpy().tobytes() + b"tail"
    assert w.digest == _sha(out)
    assert w.size == out.stat().st_size


def test_a_copy_longer_than_a_chunk_is_compared_chunk_by_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source that differs in its third chunk: the first two are the kernel's copies, the
    rest is written from memory, and the file holds the tensor's bytes."""
    monkeypatch.setattr(hashed_writer, "COPY_CHUNK", 4096)
    tensor = _tensor(10_000)  # ten chunks of 4 KiB
    source, at = _source(tmp_path, tensor)
    raw = bytearray(source.read_bytes())
    raw[at + 2 * 4096 + 7] ^= 0xFF
    source.write_bytes(bytes(raw))
    out = tmp_path / "weights.data"
    with HashedWriter(out) as w:
        assert w.copy(str(source), at, tensor) is CopyOutcome.DIFFERS
    assert out.read_bytes() == tensor.numpy().tobytes()
    assert w.digest == _sha(out)


def test_a_source_shorter_than_the_range_differs(tmp_path: Path) -> None:
    tensor = _tensor(5000)
    source, at = _source(tmp_path, tensor)
    source.write_bytes(source.read_bytes()[:-10])
    out = tmp_path / "weights.data"
    with HashedWriter(out) as w:
        assert w.copy(str(source), at, tensor) is CopyOutcome.DIFFERS
    assert out.read_bytes() == tensor.numpy().tobytes()
    assert w.digest == _sha(out)


def test_a_copy_across_filesystems_the_kernel_refuses_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem other than the test's temporary folder")
    tensor = _tensor(5000)
    folder = shm / f"hyperexport-test-{tmp_path.name}"
    folder.mkdir()
    try:
        source, at = _source(folder, tensor)
        out = tmp_path / "weights.data"
        monkeypatch.setattr(hashed_writer, "_kernel_copy_refused_once", False)
        with HashedWriter(out) as w, caplog.at_level(logging.WARNING):
            outcome = w.copy(str(source), at, tensor)
        if outcome is CopyOutcome.COPIED:
            pytest.skip("this kernel copies between tmpfs and the test's filesystem")
        assert outcome is CopyOutcome.WRITTEN
        assert "weights.data: no kernel copy from the checkpoint" in caplog.text
        assert out.read_bytes() == tensor.numpy().tobytes()
        assert w.digest == _sha(out)
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_a_file_left_by_an_error_has_no_digest(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), HashedWriter(tmp_path / "w.data") as w:
        w.write(b"abc")
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="not closed cleanly"):
        _ = w.digest

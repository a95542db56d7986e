"""The remote cache tier (issue 11, item 4), through the engine alone: against ``file://`` and
a real S3 endpoint.

The S3 endpoint is moto's server on 127.0.0.1 (a free port), started and stopped here; s3fs
talks to it over HTTP as it would to AWS. Without fsspec (or s3fs and moto) the tests that
need them are skipped.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fsspec")

from hyperexport.engine.errors import CacheUnavailableError
from hyperexport.engine.remote import Remote, remote_from_settings
from hyperexport.engine.runner import BuildResult
from tests.engine.fakes import build, slow_pipeline, statuses
from tests.helpers.s3 import s3_client, s3_options, s3_server

BUCKET = "hx-cache"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 endpoint (moto) on loopback, with one empty bucket."""
    with s3_server(BUCKET) as url:
        yield url


def _fake_build(
    tmp_path: Path, setup: str, remote: str, mode: str = "read_write", **options: Any
) -> BuildResult:
    return build(
        tmp_path / setup / "cache",
        slow_pipeline(big=3 << 20),
        remote=Remote(remote, mode=mode, storage_options=options),
    )


HITS = {"trace": "hit", "export": "hit", "rewrite": "hit", "check": "hit"}
RAN = {"trace": "ran", "export": "ran", "rewrite": "ran", "check": "ran"}


# -- file:// ----------------------------------------------------------------------------------
def test_file_remote_serves_a_fresh_setup(tmp_path: Path) -> None:
    remote = f"file://{tmp_path / 'remote'}"
    a = _fake_build(tmp_path, "a", remote)
    assert statuses(a) == RAN
    b = _fake_build(tmp_path, "b", remote)
    assert statuses(b) == HITS
    assert b.entries["rewrite"].digests() == a.entries["rewrite"].digests()
    # Blobs came down into B's own store, verified; B's next build is local.
    for f in b.entries["rewrite"].outputs:
        assert (tmp_path / "b" / "cache" / "blobs" / f.digest[:2] / f.digest).is_file()
    assert statuses(_fake_build(tmp_path, "b", remote)) == HITS
    assert not list((tmp_path / "remote").rglob("*.tmp"))


def test_dry_run_reads_remote_entries_and_writes_nothing(tmp_path: Path) -> None:
    remote = f"file://{tmp_path / 'remote'}"
    _fake_build(tmp_path, "a", remote)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = build(
        tmp_path / "b" / "cache",
        slow_pipeline(),
        remote=Remote(remote, mode="read_only"),
        dry_run=True,
    )
    assert statuses(plan) == HITS
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_read_only_remote_never_writes(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    outcome = _fake_build(tmp_path, "a", f"file://{remote_dir}", mode="read_only")
    assert outcome.ok and statuses(outcome) == RAN
    assert list(remote_dir.rglob("*")) == []


def test_corrupt_remote_blob_is_a_miss_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote_dir = tmp_path / "remote"
    a = _fake_build(tmp_path, "a", f"file://{remote_dir}")
    big = next(f for f in a.entries["export"].outputs if f.path == "big.bin")
    blob = remote_dir / "blobs" / big.digest[:2] / big.digest
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        b = _fake_build(tmp_path, "b", f"file://{remote_dir}")
    assert b.ok
    assert statuses(b) == {"trace": "hit", "export": "ran", "rewrite": "hit", "check": "hit"}
    assert "does not match its digest" in caplog.text
    assert blob.read_bytes() != bytes(data)  # healed on the remote by B's upload
    assert statuses(_fake_build(tmp_path, "c", f"file://{remote_dir}")) == HITS
    assert not list((tmp_path / "b" / "cache" / "blobs").rglob("*.download"))


def test_an_unknown_remote_filesystem_is_unavailable() -> None:
    with pytest.raises(CacheUnavailableError, match="nosuchfs"):
        remote_from_settings("nosuchfs://bucket/x", "read_write", {})


def test_an_oversized_remote_blob_is_read_only_to_its_declared_size_and_never_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: a 300 MB object declared as 6964 B was downloaded in full before the size
    check, then deleted on the remote."""
    remote_dir = tmp_path / "remote"
    a = _fake_build(tmp_path, "a", f"file://{remote_dir}")
    big = next(f for f in a.entries["export"].outputs if f.path == "big.bin")
    blob = remote_dir / "blobs" / big.digest[:2] / big.digest
    planted = b"\0" * (big.size + (8 << 20))
    blob.write_bytes(planted)
    reads: list[int] = []
    download = Remote._download

    def counted(self: Remote, path: str, target: Path, size: int) -> int:
        reads.append(download(self, path, target, size))
        return reads[-1]

    monkeypatch.setattr(Remote, "_download", counted)
    with caplog.at_level(logging.WARNING):
        b = _fake_build(tmp_path, "b", f"file://{remote_dir}", "read_only")
    assert b.ok and statuses(b)["export"] == "ran"
    assert f"more than the declared {big.size} bytes" in caplog.text
    assert max(reads) == big.size + 1  # stopped one byte past what the entry declares
    assert blob.read_bytes() == planted  # a read-only build never writes, nor deletes
    c = _fake_build(tmp_path, "c", f"file://{remote_dir}")  # read_write: replaced, verified
    assert c.ok
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == big.digest


# -- a real S3 endpoint -------------------------------------------------------------------------
def test_s3_read_only_mode_fetches_but_never_uploads(s3_endpoint: str, tmp_path: Path) -> None:
    remote = "s3://hx-cache/read-only-test"
    options = s3_options(s3_endpoint)
    first = _fake_build(tmp_path, "a", remote, "read_only", **options)
    assert statuses(first) == RAN
    client = s3_client(s3_endpoint)
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="read-only-test/")
    assert listed.get("KeyCount", 0) == 0
    _fake_build(tmp_path, "b", remote, "read_write", **options)  # fills the remote
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="read-only-test/")
    keys = [o["Key"] for o in listed["Contents"]]
    assert any("/actions/" in k for k in keys) and any("/blobs/" in k for k in keys)
    assert not any(k.endswith(".tmp") for k in keys)
    c = _fake_build(tmp_path, "c", remote, "read_only", **options)
    assert statuses(c) == HITS, [s.line() for s in c.stages]


@pytest.mark.slow
def test_s3_upload_of_a_large_blob_is_multipart(s3_endpoint: str, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:  # over s3fs's 2 x 50 MiB single-put limit
        for _ in range(110):
            fh.write(bytes(range(256)) * 4096)
    remote = Remote("s3://hx-cache/multipart", storage_options=s3_options(s3_endpoint))
    remote._put_file(big, f"{remote.root}/blobs/xx/big")
    client = s3_client(s3_endpoint)
    head = client.head_object(Bucket=BUCKET, Key="multipart/blobs/xx/big")
    assert head["ContentLength"] == big.stat().st_size
    assert "-" in head["ETag"]  # S3's ETag of a multipart upload: "<md5 of md5s>-<parts>"

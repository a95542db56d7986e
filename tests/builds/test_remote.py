"""The remote cache tier (issue 11, item 4): against ``file://`` and a real S3 endpoint.

The S3 endpoint is moto's server on 127.0.0.1 (a free port), started and stopped here; s3fs
talks to it over HTTP as it would to AWS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperexport import exit_codes
from hyperexport.builds.session import BuildOutcome, run_build
from hyperexport.config import BuildSettings
from hyperexport.contracts.names import STAGE_NAMES
from hyperexport.engine.remote import Remote
from tests.builds.fault_driver import settings, stages
from tests.helpers.builds import toy_package_in
from tests.helpers.builds import toy_package_recipe as toy_recipe
from tests.helpers.fake_recipe import recipe
from tests.helpers.statuses import statuses


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

SECRET = "hx-test-secret-never-reported"
BUCKET = "hx-cache"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 endpoint (moto) on loopback, with one empty bucket."""
    import boto3

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client(
            "s3",
            endpoint_url=url,
            aws_access_key_id="hx",
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()


def _s3_options(endpoint: str) -> dict[str, Any]:
    return {"key": "hx", "secret": SECRET, "client_kwargs": {"endpoint_url": endpoint}}


def _fake_build(
    tmp_path: Path, setup: str, remote: str, mode: str = "read_write", **options: Any
) -> BuildOutcome:
    return run_build(
        recipe(),
        settings(
            tmp_path / setup / "cache",
            tmp_path / setup / "outputs",
            remote=remote,
            remote_mode=mode,
            storage_options=options,
        ),
        stages=stages(big=3 << 20),
        load_model=lambda: "model",
    )


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


HITS = {"trace": "hit", "export": "hit", "rewrite": "hit", "check": "hit"}
RAN = {"trace": "ran", "export": "ran", "rewrite": "ran", "check": "ran"}
# The real pipeline's stages (the fakes have four).
REAL_HITS = dict.fromkeys(STAGE_NAMES, "hit")
REAL_RAN = dict.fromkeys(STAGE_NAMES, "ran")


# -- file:// ----------------------------------------------------------------------------------
def test_file_remote_serves_a_fresh_setup(tmp_path: Path) -> None:
    remote = f"file://{tmp_path / 'remote'}"
    a = _fake_build(tmp_path, "a", remote)
    assert statuses(a) == RAN
    b = _fake_build(tmp_path, "b", remote)
    assert statuses(b) == HITS
    model = Path("fake") / "default" / "model.onnx"
    assert (tmp_path / "b/outputs" / model).read_bytes() == (
        tmp_path / "a/outputs" / model
    ).read_bytes()
    # Blobs came down into B's own store, verified; B's next build is local.
    assert statuses(_fake_build(tmp_path, "b", remote)) == HITS
    assert not list((tmp_path / "remote").rglob("*.tmp"))


def test_dry_run_reads_remote_entries_and_writes_nothing(tmp_path: Path) -> None:
    remote = f"file://{tmp_path / 'remote'}"
    _fake_build(tmp_path, "a", remote)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = run_build(
        recipe(),
        BuildSettings(
            cache_dir=str(tmp_path / "b" / "cache"),
            outputs_dir=tmp_path / "b" / "outputs",
            dry_run=True,
            force=(),
            remote=remote,
        ),
        stages=stages(),
        load_model=lambda: "model",
    )
    assert statuses(plan) == HITS
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_read_only_remote_never_writes(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    outcome = _fake_build(tmp_path, "a", f"file://{remote_dir}", mode="read_only")
    assert outcome.exit_code == 0 and statuses(outcome) == RAN
    assert list(remote_dir.rglob("*")) == []


def test_corrupt_remote_blob_is_a_miss_and_is_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    remote_dir = tmp_path / "remote"
    a = _fake_build(tmp_path, "a", f"file://{remote_dir}")
    big = next(f for f in a.result.entries["export"].outputs if f.path == "big.bin")
    blob = remote_dir / "blobs" / big.digest[:2] / big.digest
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        b = _fake_build(tmp_path, "b", f"file://{remote_dir}")
    assert b.exit_code == 0
    assert statuses(b) == {"trace": "hit", "export": "ran", "rewrite": "hit", "check": "hit"}
    assert "does not match its digest" in caplog.text
    assert blob.read_bytes() != bytes(data)  # healed on the remote by B's upload
    assert statuses(_fake_build(tmp_path, "c", f"file://{remote_dir}")) == HITS
    assert not list((tmp_path / "b" / "cache" / "blobs").rglob("*.download"))


def test_unknown_remote_filesystem_is_exit_3(tmp_path: Path) -> None:
    outcome = _fake_build(tmp_path, "a", "nosuchfs://bucket/x")
    assert outcome.exit_code == exit_codes.UNAVAILABLE
    assert outcome.result.stages == []


# -- a real S3 endpoint -------------------------------------------------------------------------
def test_s3_remote_serves_a_fresh_setup_byte_identical(
    s3_endpoint: str, toy_package: Path, tmp_path: Path
) -> None:
    """Acceptance: setup A builds and uploads; setup B (empty cache, other outputs) hits every
    stage from the remote, and its artifacts are byte-identical. Real stages (torch, ORT)."""
    pkg = toy_package
    remote = "s3://hx-cache/team/cache"
    outcomes = {}
    for setup in ("a", "b"):
        outcomes[setup] = _real_build(toy_recipe(pkg), tmp_path / setup, remote, s3_endpoint)
    assert {s["name"]: s["status"] for s in outcomes["a"].report["stages"]} == REAL_RAN  # type: ignore[index]
    assert {s["name"]: s["status"] for s in outcomes["b"].report["stages"]} == REAL_HITS  # type: ignore[index]
    a_files = _files(outcomes["a"].out_dir)
    b_files = _files(outcomes["b"].out_dir)
    # The artifacts (the files the cache's entries publish); reports name their own paths.
    published = set(outcomes["a"].report["files"])  # type: ignore[index]
    assert "model.onnx" in published
    assert published and {k: a_files[k] for k in published} == {k: b_files[k] for k in published}
    for setup in ("a", "b"):
        for path in (tmp_path / setup).rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_s3_read_only_mode_fetches_but_never_uploads(s3_endpoint: str, tmp_path: Path) -> None:
    import boto3

    remote = "s3://hx-cache/read-only-test"
    options = _s3_options(s3_endpoint)
    first = _fake_build(tmp_path, "a", remote, "read_only", **options)
    assert statuses(first) == RAN
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="hx",
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="read-only-test/")
    assert listed.get("KeyCount", 0) == 0
    _fake_build(tmp_path, "b", remote, "read_write", **options)  # fills the remote
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="read-only-test/")
    keys = [o["Key"] for o in listed["Contents"]]
    assert any("/actions/" in k for k in keys) and any("/blobs/" in k for k in keys)
    assert not any(k.endswith(".tmp") for k in keys)
    c = _fake_build(tmp_path, "c", remote, "read_only", **options)
    assert statuses(c) == HITS, [s.line() for s in c.result.stages]


def test_unreachable_s3_endpoint_is_exit_3(tmp_path: Path) -> None:
    options = {
        "key": "hx",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_free_port()}"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    outcome = _fake_build(tmp_path, "a", "s3://hx-cache/x", **options)
    assert outcome.exit_code == exit_codes.UNAVAILABLE


@pytest.mark.slow
def test_s3_upload_of_a_large_blob_is_multipart(s3_endpoint: str, tmp_path: Path) -> None:
    import boto3

    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:  # over s3fs's 2 x 50 MiB single-put limit
        for _ in range(110):
            fh.write(bytes(range(256)) * 4096)
    remote = Remote("s3://hx-cache/multipart", storage_options=_s3_options(s3_endpoint))
    remote._put_file(big, f"{remote.root}/blobs/xx/big")
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="hx",
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    head = client.head_object(Bucket=BUCKET, Key="multipart/blobs/xx/big")
    assert head["ContentLength"] == big.stat().st_size
    assert "-" in head["ETag"]  # S3's ETag of a multipart upload: "<md5 of md5s>-<parts>"


# -- helpers for the real-stage acceptance test --------------------------------------------
def _real_build(recipe_: Any, setup: Path, remote: str, endpoint: str) -> BuildOutcome:
    from hyperexport.stages import PIPELINE, model_loader

    outcome = run_build(
        recipe_,
        BuildSettings(
            cache_dir=str(setup / "cache"),
            outputs_dir=setup / "outputs",
            dry_run=False,
            force=(),
            remote=remote,
            storage_options=_s3_options(endpoint),
        ),
        stages=PIPELINE,
        load_model=model_loader(recipe_),
    )
    assert outcome.exit_code == 0, outcome.lines
    report = json.loads((outcome.out_dir / "report.json").read_text())
    assert report["check"]["ok"] is True
    return outcome


def test_an_oversized_remote_blob_is_read_only_to_its_declared_size_and_never_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: a 300 MB object declared as 6964 B was downloaded in full before the size
    check, then deleted on the remote."""
    remote_dir = tmp_path / "remote"
    a = _fake_build(tmp_path, "a", f"file://{remote_dir}")
    big = next(f for f in a.result.entries["export"].outputs if f.path == "big.bin")
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
    assert b.exit_code == 0 and statuses(b)["export"] == "ran"
    assert f"more than the declared {big.size} bytes" in caplog.text
    assert max(reads) == big.size + 1  # stopped one byte past what the entry declares
    assert blob.read_bytes() == planted  # a read-only build never writes, nor deletes
    c = _fake_build(tmp_path, "c", f"file://{remote_dir}")  # read_write: replaced, verified
    assert c.exit_code == 0
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == big.digest

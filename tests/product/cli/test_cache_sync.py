"""``cache push`` / ``cache pull``: seed a remote from a warm local cache and fill a fresh cache
from it; idempotent, verified by digest. Against ``file://`` and moto's S3 server on loopback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.cli import cache as cache_cli
from tests.helpers.fake_recipe import recipe
from tests.helpers.s3 import KEY, SECRET, s3_server
from tests.product.builds.fault_driver import settings, stages

HITS = ["hit"] * 4
RAN = ["ran"] * 4


def _build(root: Path, remote: str | None = None, mode: str = "read_write") -> BuildOutcome:
    extra: dict[str, Any] = {"remote": remote, "remote_mode": mode} if remote else {}
    outcome = run_build(
        recipe(),
        settings(root / "cache", root / "outputs", **extra),
        stages=stages(big=1 << 20),
        load_model=lambda: "model",
    )
    assert outcome.exit_code == 0, outcome.lines
    return outcome


def _statuses(outcome: BuildOutcome) -> list[str]:
    return [s.status for s in outcome.result.stages]


def _sync(
    capsys: pytest.CaptureFixture[str], command: str, root: Path, url: str, *extra: str
) -> tuple[int, str]:
    capsys.readouterr()
    code = cache_cli.main([command, url, "--cache-dir", str(root / "cache"), *extra])
    return code, capsys.readouterr().out


def _seed_and_fill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, *extra: str
) -> None:
    warm, fresh = tmp_path / "warm", tmp_path / "fresh"
    assert _statuses(_build(warm)) == RAN  # a warm cache built without any remote
    code, out = _sync(capsys, "push", warm, url, *extra)
    assert code == 0, out
    assert "4 pushed, 0 already there, 0 failed" in out
    code, out = _sync(capsys, "push", warm, url, *extra)  # idempotent
    assert "0 pushed, 4 already there, 0 failed" in out, out
    code, out = _sync(capsys, "pull", fresh, url, *extra)
    assert code == 0 and "4 pulled, 0 already here, 0 failed" in out, out
    code, out = _sync(capsys, "pull", fresh, url, *extra)
    assert code == 0 and "0 pulled, 4 already here" in out, out
    assert _statuses(_build(fresh)) == HITS  # no remote configured: all local hits


def test_push_then_pull_through_a_file_remote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"file://{tmp_path / 'remote'}"
    _seed_and_fill(tmp_path, capsys, url)
    assert not list((tmp_path / "remote").rglob("*.tmp"))


def test_pull_verifies_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = f"file://{tmp_path / 'remote'}"
    _build(tmp_path / "warm")
    assert _sync(capsys, "push", tmp_path / "warm", url)[0] == 0
    blobs = [p for p in (tmp_path / "remote" / "blobs").rglob("*") if p.is_file()]
    blob = max(blobs, key=lambda p: p.stat().st_size)
    blob.write_bytes(b"x" * blob.stat().st_size)  # same size, wrong content
    code, out = _sync(capsys, "pull", tmp_path / "fresh", url)
    assert code == 1 and "1 failed" in out, out
    assert "does not match its digest" in caplog.text


def test_push_only_the_named_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"file://{tmp_path / 'remote'}"
    _build(tmp_path / "warm")
    code, out = _sync(capsys, "push", tmp_path / "warm", url, "--recipe", "other")
    assert code == 0 and "0 pushed, 0 already there" in out, out
    assert not (tmp_path / "remote" / "actions").exists()


def test_a_read_only_miss_says_nothing_was_uploaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    outcome = _build(tmp_path, f"file://{tmp_path / 'remote'}", "read_only")
    assert _statuses(outcome) == RAN
    warned = [r for r in caplog.records if "read-only, nothing uploaded" in r.getMessage()]
    assert len(warned) == 4 and all(r.levelno == logging.WARNING for r in warned)


# -- S3 (moto's server on loopback) --------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with s3_server("hx-sync") as url:
        yield url


def test_push_then_pull_through_s3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], s3_endpoint: str
) -> None:
    options = [f"key={KEY}", f"secret={SECRET}", f"endpoint_url={s3_endpoint}"]
    extra = [arg for option in options for arg in ("--storage-option", option)]
    _seed_and_fill(tmp_path, capsys, "s3://hx-sync/seeded", *extra)

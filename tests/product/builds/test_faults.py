"""Cache faults heal or fail clearly: corrupt blobs of any size, read-only and unusable caches,
scratch folders of killed builds.

Builds run for real (the fake pipeline writes real files through the real runner and store);
the ones that are killed or sandboxed run in their own process (``fault_driver.py``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import exit_codes
from hyperexport.engine.store import VERIFY_LIMIT, CacheStore
from hyperexport.product.builds.session import BuildOutcome, run_build
from tests.helpers.driver_process import (
    REPO,
    private_mounts_refusal,
    run_in_private_mounts,
    wait_for_line,
)
from tests.helpers.fake_recipe import recipe
from tests.helpers.statuses import statuses
from tests.product.builds.fault_driver import settings, stages, start_driver

BIG = VERIFY_LIMIT + (1 << 20)  # over the lookup's full-verification limit


def _build(tmp_path: Path, cache: str = "cache", **kw: Any) -> BuildOutcome:
    rec = recipe(**kw.pop("recipe", {}))
    return run_build(
        rec,
        settings(tmp_path / cache, tmp_path / "outputs"),
        stages=stages(**kw),
        load_model=lambda: "model",
    )


def _flip_first_byte(path: Path) -> None:
    path.chmod(0o644)
    with open(path, "r+b") as fh:
        first = fh.read(1)
        fh.seek(0)
        fh.write(bytes([first[0] ^ 0xFF]))


def _blob_of(tmp_path: Path, outcome: BuildOutcome, stage: str, name: str) -> Path:
    store = CacheStore(tmp_path / "cache")
    entry = outcome.result.entries[stage]
    (f,) = [f for f in entry.outputs if f.path == name]
    return store.blob_path(f.digest)


# slow: the longest default test (93 s under load); a corrupt big published blob stays in the
# default run (test_corrupt_big_published_blob_is_rebuilt)
@pytest.mark.slow
def test_corrupt_big_blob_upstream_of_a_stage_that_must_run_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _build(tmp_path, big=BIG)
    assert first.exit_code == 0
    blob = _blob_of(tmp_path, first, "export", "big.bin")
    _flip_first_byte(blob)  # same size: the lookup (size check only) still sees a hit
    with caplog.at_level(logging.WARNING):
        again = _build(tmp_path, big=BIG, recipe={"rewrite__optimize": True})
    assert again.exit_code == 0, again.lines
    assert statuses(again) == {"trace": "hit", "export": "ran", "rewrite": "ran", "check": "ran"}
    assert "corrupt" in caplog.text and "rebuilding" in caplog.text
    # The rebuilt blob is sound again, and a third build is all hits.
    third = _build(tmp_path, big=BIG, recipe={"rewrite__optimize": True})
    assert set(statuses(third).values()) == {"hit"}


def test_corrupt_big_published_blob_is_rebuilt(tmp_path: Path) -> None:
    first = _build(tmp_path)
    model = tmp_path / "outputs" / "fake" / "default" / "model.onnx"
    good = model.read_bytes()
    blob = _blob_of(tmp_path, first, "rewrite", "model.onnx")
    model.unlink()  # published again from the (now corrupt) blob
    _flip_first_byte(blob)
    again = _build(tmp_path)
    assert again.exit_code == 0
    assert model.read_bytes() == good


def test_cache_dir_that_is_a_file_is_one_line_and_exit_3(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "cache").write_text("not a directory")
    with caplog.at_level(logging.ERROR):
        outcome = _build(tmp_path)
    assert outcome.exit_code == exit_codes.UNAVAILABLE
    assert outcome.result.stages == []  # detected before any stage ran
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(tmp_path / "cache") in errors[0]
    assert not (tmp_path / "outputs").exists()


def test_cache_dir_under_a_file_is_exit_3(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    outcome = _build(tmp_path, cache="file/cache")
    assert outcome.exit_code == exit_codes.UNAVAILABLE


# -- read-only caches (a real read-only bind mount, in a private mount namespace) -------------
def _driver_read_only(cache: Path, outputs: Path) -> subprocess.CompletedProcess[str]:
    """Run the driver with ``cache`` bind-mounted read-only onto itself (root can't write)."""
    script = (
        f"mount --bind {cache} {cache} && mount -o remount,ro,bind {cache} && "
        f"touch {cache}/probe 2>/dev/null && echo WRITABLE; "
        f"{sys.executable} -m tests.product.builds.fault_driver {cache} {outputs}"
    )
    return run_in_private_mounts(script, timeout=120)


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_read_only_cache_serves_hits_and_writes_nothing(tmp_path: Path) -> None:
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    # Primed by a build in a process like the sandboxed one: the stages that run user code are
    # keyed by the modules loaded (discovered dependencies), and pytest's differ.
    prime = start_driver(cache, tmp_path / "primed")
    prime.communicate(timeout=120)
    assert prime.returncode == 0
    before = _tree(cache)
    run = _driver_read_only(cache, outputs)
    assert "WRITABLE" not in run.stdout  # the mount really is read-only
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr
    assert set(result["stages"].values()) == {"hit"}
    assert "not writable" in run.stderr
    assert _tree(cache) == before
    out = outputs / "fake" / "default"
    assert (out / "model.onnx").is_file() and (out / "report.json").is_file()


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_weights_that_cannot_fit_on_the_cache_disk_stop_the_export_before_it_writes_them(
    tmp_path: Path,
) -> None:
    """A real 12 MiB filesystem (tmpfs, in a private mount namespace) holds the trace of a Llama
    with 8 MiB of embeddings, not the export's data file and the build's copy of it: the export
    stage refuses before its first weight, in one line, exit 3."""
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    cache.mkdir()
    build = (
        f"{sys.executable} -m hyperexport recipe=llama +model.vocab_size=32768 "
        f"build.cache_dir={cache} build.outputs_dir={outputs}"
    )
    script = f"mount -t tmpfs -o size=12m tmpfs {cache} && {build}; echo rc=$?; du -sk {cache}"
    run = run_in_private_mounts(script, timeout=300)
    assert f"rc={exit_codes.UNAVAILABLE}" in run.stdout, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("[ERROR]")]
    assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.fullmatch(
        rf"\[ERROR\] cache directory {re.escape(str(cache))}: the export writes about "
        r"1\d\.\d MiB \(2 x the 8\.\d MiB of weights\), \d+\.\d MiB is free",
        errors[0],
    ), errors[0]
    used_kib = int(run.stdout.split()[-2])
    assert used_kib < 4 << 10  # the trace only: no weight was written
    assert not (outputs / "llama").exists()


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_read_only_cache_with_a_miss_fails_with_one_line_and_exit_3(tmp_path: Path) -> None:
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    cache.mkdir()
    run = _driver_read_only(cache, outputs)
    assert run.returncode == exit_codes.UNAVAILABLE, run.stdout + run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("[ERROR]")]
    assert len(errors) == 1
    assert str(cache) in errors[0] and "read-only" in errors[0] and "trace" in errors[0]
    assert "Traceback" not in run.stderr
    assert "running trace" not in run.stdout  # failed before the stage ran
    assert not (outputs / "fake").exists()
    assert list(cache.iterdir()) == []


# -- scratch of killed builds ------------------------------------------------------------------
def test_scratch_of_a_killed_build_is_removed_by_the_next(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    victim = start_driver(cache, tmp_path / "killed", "--delay", "60", "--slow", "export")
    wait_for_line(victim, "running export")  # mid-stage: trace committed, export running
    leftover = sorted((cache / "tmp").iterdir())
    assert leftover, "the running build has scratch folders"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    again = _build(tmp_path)
    assert again.exit_code == 0
    assert statuses(again)["trace"] == "hit"
    assert list((cache / "tmp").iterdir()) == []
    assert list((cache / "locks" / "scratch").iterdir()) == []
    clean = run_build(
        recipe(),
        settings(tmp_path / "clean-cache", tmp_path / "clean"),
        stages=stages(),
        load_model=lambda: "model",
    )
    published = tmp_path / "outputs" / "fake" / "default" / "model.onnx"
    assert published.read_bytes() == (clean.out_dir / "model.onnx").read_bytes()


def test_scratch_of_a_live_build_is_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    live = start_driver(cache, tmp_path / "live", "--delay", "60", "--slow", "trace")
    try:
        wait_for_line(live, "running trace")
        scratch = sorted((cache / "tmp").iterdir())
        assert scratch
        # Another build of another recipe on the same cache runs meanwhile.
        other = _build(tmp_path, recipe={"name": "other", "inputs__input_ids__high": 100})
        assert other.exit_code == 0
        assert all(p.is_dir() for p in scratch)
    finally:
        live.kill()
        live.wait()


@pytest.mark.slow
def test_kill_9_of_a_real_cli_build_mid_export_then_rebuild(tmp_path: Path) -> None:
    """The real pipeline through the command line: kill -9 while export runs; the next build
    removes the dead scratch and its model is byte-identical to a clean build's."""
    from tests.helpers.cli import run, write_toy

    toy = write_toy(tmp_path)
    cache = tmp_path / "cache"
    paths = [str(tmp_path / "user"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    victim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hyperexport",
            f"recipe_file={toy}",
            f"build.cache_dir={cache}",
            f"build.outputs_dir={tmp_path / 'outputs'}",
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and victim.poll() is None:
        if any(p.name.startswith("export-") for p in (cache / "tmp").glob("*")):
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the build ended before export ran"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert list((cache / "tmp").iterdir()), "the killed build left its scratch"
    again = run([f"recipe_file={toy}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert list((cache / "tmp").iterdir()) == []
    clean_root = tmp_path / "clean"
    clean_root.mkdir()
    clean = run([f"recipe_file={write_toy(clean_root)}"], clean_root)
    assert clean.returncode == 0, clean.stderr
    model = Path("outputs") / "toy" / "default" / "model.onnx"
    assert (tmp_path / model).read_bytes() == (clean_root / model).read_bytes()


# -- the filesystem refuses a write: full, read-only, not permitted, over quota ----------------
class _Refusing:
    """A stage that writes into its scratch folder, where the filesystem refuses with ``code``."""

    def __init__(self, base: Any, code: int, inside: bool) -> None:
        self._base, self._code, self._inside = base, code, inside
        for name in ("name", "version", "upstream", "reads", "needs_model", "libraries"):
            setattr(self, name, getattr(base, name))
        self.publish, self.outputs = base.publish, base.outputs

    def run(self, params: Any, inputs: Any, out_dir: Path) -> None:
        target = out_dir / "model.onnx" if self._inside else Path("/nonexistent/elsewhere")
        raise OSError(self._code, os.strerror(self._code), str(target))


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT", "EROFS", "EACCES"])
def test_a_refused_write_in_the_cache_is_exit_3_naming_it(
    tmp_path: Path, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21: a full cache filesystem gave rc 1, "stage 'rewrite' failed: [Errno 28]"."""
    import errno

    pipeline = list(stages())
    index = next(i for i, s in enumerate(pipeline) if s.name == "rewrite")
    pipeline[index] = _Refusing(pipeline[index], getattr(errno, code), inside=True)
    with caplog.at_level(logging.ERROR):
        outcome = run_build(
            recipe(),
            settings(tmp_path / "cache", tmp_path / "outputs"),
            stages=pipeline,
            load_model=lambda: "model",
        )
    assert outcome.exit_code == exit_codes.UNAVAILABLE
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"cache directory {tmp_path / 'cache'}: {os.strerror(getattr(errno, code))}"]
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []  # no scratch left


def test_a_refused_write_elsewhere_is_the_stages_own_failure(tmp_path: Path) -> None:
    import errno

    pipeline = list(stages())
    index = next(i for i, s in enumerate(pipeline) if s.name == "rewrite")
    pipeline[index] = _Refusing(pipeline[index], errno.EACCES, inside=False)
    outcome = run_build(
        recipe(),
        settings(tmp_path / "cache", tmp_path / "outputs"),
        stages=pipeline,
        load_model=lambda: "model",
    )
    assert outcome.exit_code == exit_codes.FAILED


def test_a_full_outputs_filesystem_is_exit_3_naming_the_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 21: full outputs gave rc 3 with a message naming a cache blob."""
    import errno

    from hyperexport.product.builds import publish

    def full(source: Path, target: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source))

    monkeypatch.setattr(publish, "clone_or_copy_hashed", full)
    with caplog.at_level(logging.ERROR):
        outcome = _build(tmp_path)
    assert outcome.exit_code == exit_codes.UNAVAILABLE
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"outputs directory {tmp_path / 'outputs'}: {os.strerror(errno.ENOSPC)}"]


# -- full filesystems (a real small tmpfs, in a private mount namespace) -----------------------
def _driver_on_tmpfs(
    mount: Path, size: str, cache: Path, outputs: Path, *extra: str, fill: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the driver with ``mount`` a tmpfs of ``size`` (``fill``: filled by a user's file)."""
    prefill = f"mkdir {mount}/mine && (dd if=/dev/zero of={mount}/mine/fill bs=4k; true) && "
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {mount} && {prefill if fill else ''}"
        f"{sys.executable} -m tests.product.builds.fault_driver {cache} {outputs} {' '.join(extra)}; "
        "status=$?; "
        f"ls -A {cache}/tmp 2>/dev/null | sed 's/^/SCRATCH /'; "
        f"[ -f {mount}/mine/fill ] && echo USER_FILE_KEPT; "
        f"[ -e {outputs}/fake/default ] && echo PUBLISHED; exit $status"
    )
    return run_in_private_mounts(script, timeout=120)


def _one_error(run: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in run.stderr.splitlines() if line.startswith("[ERROR]")]
    assert len(errors) == 1, run.stderr
    assert "Traceback" not in run.stderr
    return errors[0]


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_a_really_full_cache_filesystem_is_exit_3_naming_it(tmp_path: Path) -> None:
    """Issue 21, on a real 1 MiB tmpfs (not an injected errno): the export stage's 3 MB file."""
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    cache.mkdir()
    run = _driver_on_tmpfs(cache, "1m", cache, outputs, "--big", str(3_000_000))
    assert run.returncode == exit_codes.UNAVAILABLE, run.stdout + run.stderr
    error = _one_error(run)
    assert error.endswith(f"cache directory {cache}: {os.strerror(28)}")
    assert "SCRATCH" not in run.stdout  # the half-written stage output is gone
    assert "PUBLISHED" not in run.stdout


@pytest.mark.skipif(private_mounts_refusal() is not None, reason=str(private_mounts_refusal()))
def test_a_really_full_outputs_filesystem_is_exit_3_and_keeps_the_users_files(
    tmp_path: Path,
) -> None:
    """A real tmpfs filled by a user's file: nothing half-published, the user's file kept."""
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    outputs.mkdir()
    run = _driver_on_tmpfs(outputs, "64k", cache, outputs, fill=True)
    assert run.returncode == exit_codes.UNAVAILABLE, run.stdout + run.stderr
    error = _one_error(run)
    assert error.endswith(f"outputs directory {outputs}: {os.strerror(28)}")
    assert "USER_FILE_KEPT" in run.stdout
    assert "PUBLISHED" not in run.stdout

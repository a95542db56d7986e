"""Atomic publishing: one link per variant, swapped only when a complete build is in place.

The fault tests run real processes (fake stages, no torch) and kill them for real: with
SIGKILL while the publication is paused just before the swap, and at random points in a loop.
After every kill, the published report's digests must match the published files.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hyperexport.engine.hashing import sha256_file
from hyperexport.product.builds.cleanup import remove_stale_builds
from hyperexport.product.builds.layout import BUILDS, FAILED_SUFFIX
from hyperexport.product.builds.session import MAX_VARIANT_BYTES, run_build, variant_dir
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import FakeStage, StageBoom, pipeline
from tests.helpers.fake_recipe import recipe

REPO = Path(__file__).resolve().parents[3]

# Builds the fake recipe with optimize=<argv[3]> into outputs <argv[2]>, cache <argv[1]>. With a
# 4th argument, publishing writes that marker file just before the swap and waits for its removal.
DRIVER = """
import os, sys, time
from pathlib import Path
from hyperexport.product.config import BuildSettings
from hyperexport.product.builds import publish
from hyperexport.product.builds.session import run_build
from tests.engine.fakes import pipeline
from tests.helpers.fake_recipe import recipe

cache, outputs, optimize = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "true"
if len(sys.argv) > 4:
    marker = Path(sys.argv[4])
    swap = publish._swap_link

    def paused(link, directory):
        # written whole, then renamed: the test polls for the marker and reads it at once
        part = marker.with_name(marker.name + ".part")
        part.write_text(str(directory))
        os.replace(part, marker)
        while marker.exists():
            time.sleep(0.02)
        swap(link, directory)

    publish._swap_link = paused
settings = BuildSettings(cache_dir=cache, outputs_dir=outputs, dry_run=False, force=())
outcome = run_build(recipe(rewrite__optimize=optimize), settings, stages=pipeline(),
                    load_model=lambda: "m")
print(outcome.exit_code)
"""


def _settings(tmp_path: Path, **kw: object) -> BuildSettings:
    return BuildSettings(
        cache_dir=str(tmp_path / "cache"),
        outputs_dir=tmp_path / "outputs",
        dry_run=False,
        force=tuple(kw.get("force", ())),  # type: ignore[arg-type]
    )


def _driver(tmp_path: Path, optimize: bool, marker: Path | None = None) -> subprocess.Popen[str]:
    args = [str(tmp_path / "cache"), str(tmp_path / "outputs"), str(optimize).lower()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args, *([str(marker)] if marker else [])],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _consistent(variant: Path) -> dict[str, object]:
    """The report of the publication ``variant`` names, after checking every file's digest."""
    assert variant.is_symlink()
    directory = variant.resolve()
    report = json.loads((directory / "report.json").read_text())
    assert report["files"], report
    for rel, info in report["files"].items():
        assert sha256_file(directory / rel) == info["digest"], rel
    names = sorted(p.name for p in directory.iterdir())
    assert names == sorted([*report["files"], "report.json", "report.html", "summary.txt"])
    return report


def _optimize_of(report: dict[str, object]) -> bool:
    return bool(report["recipe"]["config"]["rewrite"]["optimize"])  # type: ignore[index]


def test_publication_is_a_link_to_a_complete_build(tmp_path: Path) -> None:
    outcome = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    variant = tmp_path / "outputs" / "fake" / "default"
    assert outcome.out_dir == variant
    assert os.readlink(variant).startswith(f"{BUILDS}/default.")  # relative: outputs can move
    report = _consistent(variant)
    assert report["artifacts"]["model"] == str(variant / "model.onnx")  # type: ignore[index]
    assert (variant / "model.onnx").is_file()


def test_new_build_swaps_and_removes_the_previous_one(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    variant = tmp_path / "outputs" / "fake" / "default"
    first = variant.resolve()
    run_build(
        recipe(rewrite__optimize=True),
        _settings(tmp_path),
        stages=pipeline(),
        load_model=lambda: "m",
    )
    assert variant.resolve() != first
    assert not first.exists()
    assert _optimize_of(_consistent(variant)) is True
    assert [p.name for p in (variant.parent / BUILDS).iterdir()] == [variant.resolve().name]


def test_noop_rebuild_keeps_the_publication(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    variant = tmp_path / "outputs" / "fake" / "default"
    directory = variant.resolve()
    outcome = run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert variant.resolve() == directory
    assert [s["status"] for s in _consistent(variant)["stages"]] == ["hit"] * 4  # type: ignore[index]
    assert outcome.report is not None and outcome.report["status"] == "ok"


def test_failed_check_keeps_the_good_build_and_publishes_the_failure(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    variant = tmp_path / "outputs" / "fake" / "default"
    good = variant.resolve()
    stages = list(pipeline())

    def diverges(params: object) -> StageBoom:
        scratch = next((tmp_path / "cache" / "tmp").glob("build-*")) / "rewrite" / "model.onnx"
        assert scratch.is_file()
        return StageBoom(f"check of {scratch} failed: output 0 diverges", "layers.0")

    stages[3] = FakeStage(
        "check",
        reads=("check",),
        upstream=("trace", "rewrite"),
        publish=("check.json",),
        declares={"check": "check.json"},
        fail=diverges,
    )
    outcome = run_build(
        recipe(rewrite__optimize=True), _settings(tmp_path), stages=stages, load_model=lambda: "m"
    )
    assert outcome.exit_code == 1
    # the good build is untouched
    assert variant.resolve() == good
    assert _optimize_of(_consistent(variant)) is False
    # the failure is published under a name that says so, with paths that exist
    failed = variant.with_name("default" + FAILED_SUFFIX)
    assert outcome.out_dir == failed
    report = _consistent(failed)
    assert report["status"] == "failed" and report["failed_stage"] == "check"
    assert _optimize_of(report) is True
    assert sorted(report["files"]) == ["check.json", "model.onnx"]  # type: ignore[arg-type]
    assert outcome.model_path == failed / "model.onnx" and outcome.model_path.is_file()
    assert f"check of {failed / 'model.onnx'} failed" in str(report["error"])
    text = json.dumps(report)
    assert str(tmp_path / "cache" / "tmp") not in text
    for path in report["artifacts"].values():  # type: ignore[attr-defined]
        assert Path(path).is_file()
    assert (failed / "summary.txt").read_text().count(str(failed / "model.onnx")) >= 1
    # the next good build removes the outdated failure
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert not failed.exists() and not failed.is_symlink()
    assert len(list((variant.parent / BUILDS).iterdir())) == 1


def test_stale_publications_are_removed_unless_their_lock_is_held(tmp_path: Path) -> None:
    run_build(recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    recipe_dir = tmp_path / "outputs" / "fake"
    dead = recipe_dir / BUILDS / "default.20000101T000000-00000000"
    dead.mkdir()
    (dead / "model.onnx").write_bytes(b"half")
    live = recipe_dir / BUILDS / "default.20000101T000000-11111111"
    live.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
            "print('held', flush=True); sys.stdin.read()",
            f"{live}.lock",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert remove_stale_builds(recipe_dir) == [dead]
        assert live.is_dir() and (recipe_dir / "default").resolve().is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert remove_stale_builds(recipe_dir) == [live]  # its holder died: the lock is free


def test_kill_during_publishing_never_leaves_a_mix(tmp_path: Path) -> None:
    """SIGKILL while the new build is complete under .builds/ but not yet linked."""
    first = _driver(tmp_path, optimize=True)
    assert first.wait(timeout=120) == 0, first.stderr.read() if first.stderr else ""
    variant = tmp_path / "outputs" / "fake" / "default"
    old = variant.resolve()
    marker = tmp_path / "paused"
    proc = _driver(tmp_path, optimize=False, marker=marker)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.02)
    staged = Path(marker.read_text())
    assert staged.is_dir() and (staged / "report.json").is_file()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert variant.resolve() == old
    assert _optimize_of(_consistent(variant)) is True
    # a later build publishes, and removes what the killed one left
    again = _driver(tmp_path, optimize=False)
    assert again.wait(timeout=120) == 0
    assert _optimize_of(_consistent(variant)) is False
    assert [p.name for p in (variant.parent / BUILDS).iterdir()] == [variant.resolve().name]


def test_kill_at_random_points_never_leaves_a_mix(tmp_path: Path) -> None:
    rng = random.Random(0)
    first = _driver(tmp_path, optimize=True)
    assert first.wait(timeout=120) == 0
    variant = tmp_path / "outputs" / "fake" / "default"
    optimize = True
    for _ in range(6):
        optimize = not optimize
        proc = _driver(tmp_path, optimize=optimize)
        time.sleep(rng.uniform(0.3, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        report = _consistent(variant)  # the old build or the new one, complete either way
        assert _optimize_of(report) in (True, False)


@pytest.mark.parametrize("count", [40])
def test_many_overrides_get_a_bounded_folder(tmp_path: Path, count: int) -> None:
    overrides = [f"+model.option_number_{i}=value_{i:04d}" for i in range(count)]
    variant = variant_dir(overrides)
    assert len(variant.encode()) <= MAX_VARIANT_BYTES
    assert variant != variant_dir(overrides[:-1])  # the digest tells them apart
    outcome = run_build(
        recipe(),
        _settings(tmp_path),
        stages=pipeline(),
        load_model=lambda: "m",
        variant=variant,
        overrides=overrides,
    )
    assert outcome.exit_code == 0
    assert len(outcome.out_dir.resolve().name.encode()) < 255
    assert outcome.report is not None and outcome.report["overrides"] == overrides
    _consistent(outcome.out_dir)


def test_variant_dir_is_one_path_component() -> None:
    for item in ["checkpoint=../../etc", "name=a/b", "x=..\\..", "y=a\x00b"]:
        name = variant_dir([item])
        assert "/" not in name and "\\" not in name and "\x00" not in name
        assert name not in (".", "..")


@pytest.mark.parametrize("name", ["default", "default.failed"])
def test_a_users_folder_at_the_variant_is_never_touched(tmp_path: Path, name: str) -> None:
    """A real folder where a publication goes is the user's: exit 3 naming it, before any
    stage runs, and its file is still there (issue 21: it was moved aside and deleted)."""
    users = tmp_path / "outputs" / "fake" / name
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine")
    ran: list[str] = []
    outcome = run_build(
        recipe(), _settings(tmp_path), stages=pipeline(), load_model=lambda: ran.append("m")
    )
    assert outcome.exit_code == 3
    assert (users / "notes.txt").read_text() == "mine"
    assert ran == [] and not (tmp_path / "outputs" / "fake" / BUILDS).exists()


def test_a_users_folder_appearing_during_the_build_is_never_touched(tmp_path: Path) -> None:
    stages = list(pipeline())
    users = tmp_path / "outputs" / "fake" / "default"

    def plant(params: object) -> None:
        users.mkdir(parents=True, exist_ok=True)
        (users / "notes.txt").write_text("mine")

    stages[-1] = replace(stages[-1], fail=plant)
    outcome = run_build(recipe(), _settings(tmp_path), stages=stages, load_model=lambda: "m")
    assert outcome.exit_code == 3
    assert (users / "notes.txt").read_text() == "mine"
    assert not users.is_symlink()


def test_removing_a_publication_spares_a_users_folder(tmp_path: Path) -> None:
    from hyperexport.product.builds.publish import remove_publication

    users = tmp_path / "fake" / "default"
    users.mkdir(parents=True)
    (users / "notes.txt").write_text("mine")
    remove_publication(users)
    assert (users / "notes.txt").read_text() == "mine"

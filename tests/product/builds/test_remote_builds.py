"""The remote cache tier as a build meets it (the tier itself: tests/engine/test_remote.py):
exit codes, and a real S3 endpoint serving the real pipeline.

The S3 endpoint is moto's server on 127.0.0.1 (a free port), started and stopped here; s3fs
talks to it over HTTP as it would to AWS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperexport.base import exit_codes
from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.product.builds.session import BuildOutcome, run_build
from hyperexport.product.config import BuildSettings
from tests.helpers.builds import toy_package_in
from tests.helpers.builds import toy_package_recipe as toy_recipe
from tests.helpers.fake_recipe import recipe
from tests.helpers.s3 import SECRET, free_port, s3_options, s3_server
from tests.product.builds.fault_driver import settings, stages


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with toy_package_in(tmp_path_factory.mktemp("toy")) as pkg:
        yield pkg


pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

BUCKET = "hx-cache"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A real S3 endpoint (moto) on loopback, with one empty bucket."""
    with s3_server(BUCKET) as url:
        yield url


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


def test_unknown_remote_filesystem_is_exit_3(tmp_path: Path) -> None:
    outcome = _fake_build(tmp_path, "a", "nosuchfs://bucket/x")
    assert outcome.exit_code == exit_codes.UNAVAILABLE
    assert outcome.result.stages == []


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


def test_unreachable_s3_endpoint_is_exit_3(tmp_path: Path) -> None:
    options = {
        **s3_options(f"http://127.0.0.1:{free_port()}"),
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    outcome = _fake_build(tmp_path, "a", "s3://hx-cache/x", **options)
    assert outcome.exit_code == exit_codes.UNAVAILABLE


# -- helpers for the real-stage acceptance test --------------------------------------------
def _real_build(recipe_: Any, setup: Path, remote: str, endpoint: str) -> BuildOutcome:
    from hyperexport.product.stages import PIPELINE, model_loader

    outcome = run_build(
        recipe_,
        BuildSettings(
            cache_dir=str(setup / "cache"),
            outputs_dir=setup / "outputs",
            dry_run=False,
            force=(),
            remote=remote,
            storage_options=s3_options(endpoint),
        ),
        stages=PIPELINE,
        load_model=model_loader(recipe_),
    )
    assert outcome.exit_code == 0, outcome.lines
    report = json.loads((outcome.out_dir / "report.json").read_text())
    assert report["check"]["ok"] is True
    return outcome

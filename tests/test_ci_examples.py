"""The CI examples (examples/ci/): valid against their published schemas (check-jsonschema's
vendored copies, where installed), run once per change, and gate on hyperexport.lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.cli import REPO

CI = REPO / "examples" / "ci"
GITHUB = (CI / "github-actions.yml", CI / "github-actions-remote.yml")
GITLAB = CI / "gitlab-ci.yml"
LOCK_CHECK = "python -m hyperexport cache status --lock"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(
    ("path", "schema"),
    [(p, "vendor.github-workflows") for p in GITHUB] + [(GITLAB, "vendor.gitlab-ci")],
    ids=lambda x: x.name if isinstance(x, Path) else x,
)
def test_valid_against_the_published_schema(path: Path, schema: str) -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema is not installed")
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", GITHUB, ids=lambda p: p.name)
def test_github_runs_once_per_change_and_checks_the_lock(path: Path) -> None:
    data = _load(path)
    on = data.get("on", data.get(True))  # YAML 1.1 reads the key `on` as True
    assert on["push"] == {"branches": ["main"]}  # a branch with a PR runs as the PR only
    assert "pull_request" in on
    runs = [step.get("run", "") for job in data["jobs"].values() for step in job["steps"]]
    assert LOCK_CHECK in runs
    assert runs.index(LOCK_CHECK) < next(i for i, r in enumerate(runs) if "-m 'recipe=" in r)


def test_gitlab_runs_once_per_change_and_checks_the_lock() -> None:
    data = _load(GITLAB)
    rules = [r["if"] for r in data["workflow"]["rules"]]
    assert rules == [
        '$CI_PIPELINE_SOURCE == "merge_request_event"',
        "$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH",
    ]
    script = data["export"]["script"]
    assert LOCK_CHECK in script
    assert script.index(LOCK_CHECK) < next(i for i, r in enumerate(script) if "-m 'recipe=" in r)
    assert data["export"]["cache"]["paths"] == [".hyperexport-cache/"]


def test_the_remote_workflow_falls_back_to_anonymous_reads_for_forks() -> None:
    text = GITHUB[1].read_text()
    assert "public read" in text and "anon=true" in text
    assert (
        "+build.storage_options.anon=${{ github.event.pull_request.head.repo.fork == true }}"
        in text
    )


@pytest.mark.parametrize("path", [*GITHUB, GITLAB], ids=lambda p: p.name)
def test_ci_installs_exactly_the_pinned_stack(path: Path) -> None:
    """Issue 32: the examples installed the registry's torch 2.13.0 while the lock records the
    CPU build 2.13.0+cpu, so the lock check failed on their first run."""
    text = path.read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs
    for line in installs:
        assert "-c constraints.txt" in line
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in line
    pinned = (REPO / "constraints.txt").read_text()
    assert "\ntorch==2.13.0+cpu\n" in pinned

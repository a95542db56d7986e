"""The CI recipe (examples/ci/): incremental rebuilds through the CLI, and the workflow's commands.

CI restores a cache and builds every recipe; that is only cheap if a rebuild after an unrelated
change is all hits, and a changed recipe field reruns only the stages that read it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from hyperexport.product.config import RECIPES_DIR
from tests.helpers.cli import REPO, probe_result, report, run, write_toy
from tests.helpers.rebuilds import reran_from
from tests.helpers.recipes import REFUSED

WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"
REMOTE_WORKFLOW = REPO / "examples" / "ci" / "github-actions-remote.yml"


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """The toy model package and its recipe ``toy.yaml`` (outside the repository)."""
    return write_toy(tmp_path)


def statuses(tmp_path: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in report(tmp_path)["stages"]}  # type: ignore[attr-defined]


# slow: four CLI builds (17 s in one full run); the default run keeps each rebuild rule in process
# (tests/e2e/test_e2e.py: no-op, an opset change from export; tests/e2e/test_e2e_keys.py: mtimes
# without content, a check-only code edit) and the CLI's no-op (tests/test_cli.py).
@pytest.mark.slow
def test_incremental_rebuild(toy: Path, tmp_path: Path) -> None:
    cold = run([f"recipe_file={toy}"], tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert set(statuses(tmp_path).values()) == {"ran"}

    # unrelated files: a script and a README beside the model's package (the package itself is
    # the model's code), and the mtimes of the sources and of the recipe (content unchanged)
    package = toy.parent / "hx_toy"
    (toy.parent / "scripts").mkdir()
    (toy.parent / "scripts" / "unrelated.py").write_text("VALUE = 1\n")
    (toy.parent / "README.md").write_text("notes\n")
    later = (package / "net.py").stat().st_mtime + 60
    for path in (package / "net.py", package / "__init__.py", toy):
        os.utime(path, (later, later))
    touched = run([f"recipe_file={toy}"], tmp_path, probe=True)
    assert probe_result(touched) == {"code": 0, "heavy": []}, touched.stderr
    assert statuses(tmp_path) == dict.fromkeys(
        ("trace", "export", "rewrite", "quantize", "evaluate", "check"), "hit"
    )

    # one field that only the check reads
    toy.write_text(toy.read_text() + "check: {atol: 1.0e-3}\n")
    tolerance = run([f"recipe_file={toy}"], tmp_path)
    assert tolerance.returncode == 0, tolerance.stderr
    assert statuses(tmp_path) == reran_from("check")
    assert "check.atol 0.0001→0.001" in report(tmp_path)["stages"][-1]["reason"]  # type: ignore[index]

    # one field that export reads: trace is reused, everything after it reruns
    toy.write_text(toy.read_text() + "opset: 17\n")
    opset = run([f"recipe_file={toy}"], tmp_path)
    assert opset.returncode == 0, opset.stderr
    assert statuses(tmp_path) == reran_from("export")


def _workflow_step(name: str, path: Path = WORKFLOW) -> dict[str, Any]:
    workflow = yaml.safe_load(path.read_text())
    (job,) = workflow["jobs"].values()
    return next(s for s in job["steps"] if s.get("name") == name)


# slow: a dry run of every recipe through the CLI sweep (30 s in one full run); the default run
# composes and validates every recipe (tests/product/config/test_recipe_fields.py) and keys each
# variant CI builds (tests/product/cli/test_lock.py::test_the_committed_lock_is_fresh).
@pytest.mark.slow
def test_workflow_builds_every_recipe(tmp_path: Path) -> None:
    """The workflow's build command, as a dry run: one job per recipe file, all valid."""
    command = _workflow_step("Build every recipe")["run"]
    args = shlex.split(command.replace("${{ github.workspace }}", str(tmp_path)))
    assert args[:3] == ["python", "-m", "hyperexport"]
    proc = run([*args[3:], "build.dry_run=true"], tmp_path, probe=True)
    if REFUSED:  # recipes naming a later transformers' classes: the sweep refuses, one line each
        assert probe_result(proc)["code"] != 0
        refused = re.findall(r"\(recipe=(\w+)\): .*needs transformers>=", proc.stderr)
        assert sorted(refused) == sorted(REFUSED), proc.stderr
        return
    assert probe_result(proc)["code"] == 0, proc.stderr
    jobs = json.loads(_printed_sweep_file(proc.stdout).read_text())["jobs"]
    assert sorted(j["overrides"][0] for j in jobs) == sorted(
        f"recipe={p.stem}" for p in RECIPES_DIR.glob("*.yaml")
    )
    assert all(j["exit_code"] == 0 for j in jobs)
    assert all(s["status"] == "would_run" for j in jobs for s in j["stages"])


def _printed_sweep_file(stdout: str) -> Path:
    line = next(x for x in stdout.splitlines() if x.startswith("sweep report: "))
    return Path(line.removeprefix("sweep report: "))


def test_workflow_cache_commands_exist(tmp_path: Path) -> None:
    for name in ("Plan", "Trim the build cache"):
        args = shlex.split(_workflow_step(name)["run"])
        assert args[:4] == ["python", "-m", "hyperexport", "cache"]
    gc = shlex.split(_workflow_step("Trim the build cache")["run"])[3:]
    proc = run(
        [*gc, "--dry-run", "--cache-dir", str(tmp_path / "cache")],
        tmp_path,
        probe=True,
        build=False,
    )
    assert probe_result(proc)["code"] == 0, proc.stderr


# slow: the longest default test (47 s in one full run); the default run keeps the workflow's own builds
# (test_workflow_builds_every_recipe, test_incremental_rebuild) and the remote tier's keys
# (tests/e2e/test_e2e_keys.py).
@pytest.mark.slow
def test_remote_workflow_builds_every_recipe_read_only_on_pull_requests(tmp_path: Path) -> None:
    """The remote workflow's build command as a pull request runs it, against a file:// remote."""
    pytest.importorskip("fsspec")
    command = _workflow_step("Build every recipe", REMOTE_WORKFLOW)["run"]
    pull_request = "${{ github.event_name == 'pull_request' && 'read_only' || 'read_write' }}"
    assert pull_request in command
    remote = tmp_path / "remote"
    remote.mkdir()
    fork = "${{ github.event.pull_request.head.repo.fork == true }}"
    assert f"+build.storage_options.anon={fork}" in command  # forks read anonymously
    command = (
        command.replace(pull_request, "read_only")
        .replace(fork, "false")
        .replace("${{ github.workspace }}", str(tmp_path))
        .replace("s3://my-bucket/hyperexport", remote.as_uri())
    )
    args = shlex.split(command)
    proc = run([*args[3:], "build.dry_run=true"], tmp_path, probe=True)
    if REFUSED:  # recipes naming a later transformers' classes: the sweep refuses, one line each
        assert probe_result(proc)["code"] != 0
        refused = re.findall(r"\(recipe=(\w+)\): .*needs transformers>=", proc.stderr)
        assert sorted(refused) == sorted(REFUSED), proc.stderr
        return
    assert probe_result(proc)["code"] == 0, proc.stderr
    jobs = json.loads(_printed_sweep_file(proc.stdout).read_text())["jobs"]
    assert len(jobs) == len(list(RECIPES_DIR.glob("*.yaml")))
    assert list(remote.iterdir()) == []  # read-only: nothing uploaded

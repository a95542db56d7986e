"""Sweeps through Hydra's launchers: one record per job, one table, sweep.json, the worst code.

The fast test runs the basic launcher on the toy model (its builds in this process,
``run_here``: what a sweep prints and writes does not depend on a fresh interpreter); the slow
one is the acceptance sweep of
the tiny Llama recipe through the joblib launcher (parallel worker processes, one cache).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import run, run_here, write_toy
from tests.helpers.release_skips import NEEDS_OPSET_18


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """The toy model package and its recipe ``toy.yaml`` (outside the repository)."""
    return write_toy(tmp_path)


def sweep_json(tmp_path: Path) -> dict[str, Any]:
    (found,) = (tmp_path / "outputs" / ".sweeps").glob("*/sweep.json")
    data: dict[str, Any] = json.loads(found.read_text())
    return data


@NEEDS_OPSET_18  # a sweep over opset=17,18
def test_sweep_reports_every_job_and_exits_with_the_worst_code(toy: Path, tmp_path: Path) -> None:
    # An invalid value refuses the sweep before any job runs, naming the job and the field.
    proc = run(["-m", f"recipe_file={toy}", "opset=17,99"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "job 1 (opset=99" in proc.stderr and "field 'opset': 99 is out of range" in proc.stderr
    assert "1 of 2 jobs refused; none was run" in proc.stderr
    assert not (tmp_path / "outputs").exists()
    # A valid sweep: one record per job, one table at the end, the worst exit code.
    proc = run_here(["-m", f"recipe_file={toy}", "opset=17,18"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    sweep = sweep_json(tmp_path)
    assert sweep["exit_code"] == 0
    first, second = sweep["jobs"]
    assert (
        first["exit_code"] == 0 and first["check"] == "passed" and "opset=17" in first["overrides"]
    )
    assert [s["status"] for s in first["stages"]] == ["ran"] * 6
    assert all(len(s["key"]) == 64 for s in first["stages"])
    assert all(isinstance(s["seconds"], float) for s in first["stages"]) and first["seconds"] > 0
    model = tmp_path / "outputs" / "toy" / "opset=17" / "model.onnx"
    assert first["artifact"] == str(model) and model.is_file()
    assert second["exit_code"] == 0 and second["stages"][0]["status"] == "hit"
    table = proc.stdout[proc.stdout.index("sweep: 2 jobs, exit code 0") :].splitlines()
    assert table[1].split()[:3] == ["job", "exit", "check"]
    assert table[2].split()[:7] == ["0", "0", "passed", "ran", "ran", "ran", "ran"]
    assert table[3].split()[:4] == ["1", "0", "passed", "hit"]
    assert (
        table[4]
        == f"sweep report: {tmp_path / 'outputs' / '.sweeps'}/{sweep_dir_name(tmp_path)}/sweep.json"
    )


def sweep_dir_name(tmp_path: Path) -> str:
    (found,) = (tmp_path / "outputs" / ".sweeps").iterdir()
    return found.name


@pytest.mark.slow
def test_joblib_sweep_of_tiny_llama_computes_each_trace_once(tmp_path: Path) -> None:
    """The acceptance sweep: 2 opsets x 2 export paths, 2 worker processes, one cache.

    Opsets 18 and 19: on the dynamo path the tiny Llama comes out at opset 18 when 17 is asked
    for (the check then fails, as it should), so 17 is not a path-independent choice.
    """
    import onnx

    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "recipe=tiny_llama"]
    proc = run([*args, "opset=18,19", "dynamo=false,true"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep = sweep_json(tmp_path)
    assert len(sweep["jobs"]) == 4
    for job in sweep["jobs"]:
        assert job["exit_code"] == 0 and job["check"] == "passed", job
        assert onnx.load(job["artifact"], load_external_data=False).graph.node
    traces = [s for job in sweep["jobs"] for s in job["stages"] if s["name"] == "trace"]
    ran = Counter(s["key"] for s in traces if s["status"] == "ran")
    assert len({s["key"] for s in traces}) == 2  # trace keys depend on dynamo, not on opset
    assert ran == Counter({key: 1 for key in ran}) and len(ran) == 2, traces


@pytest.mark.slow
def test_joblib_sweep_with_an_invalid_job_exits_2(tmp_path: Path) -> None:
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "recipe=tiny_llama"]
    proc = run([*args, "opset=18,99"], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # Every job is validated before the first one runs: the valid one is not built either.
    assert "1 of 2 jobs refused; none was run" in proc.stderr
    assert not (tmp_path / "outputs").exists()


def test_submitit_launcher_config_composes(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run_here(["--cfg", "hydra", "hydra/launcher=submitit_local"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "submitit_launcher.LocalLauncher" in proc.stdout
    assert "submitit_folder: ${hydra.sweep.dir}/.submitit/%j" in proc.stdout


@pytest.mark.slow
def test_submitit_local_sweep(toy: Path, tmp_path: Path) -> None:
    """Two jobs as separate processes through submitit (about 20 s)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = run(
        ["-m", "hydra/launcher=submitit_local", f"recipe_file={toy}", "opset=17,18"], tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    jobs = sweep_json(tmp_path)["jobs"]
    assert [(j["exit_code"], j["check"]) for j in jobs] == [(0, "passed"), (0, "passed")]
    assert all(Path(j["artifact"]).is_file() for j in jobs)
    assert all(j["stages"][0]["status"] in ("ran", "hit") for j in jobs)

"""Single flight through the command line: two builds of the real pipeline on one empty cache
(the engine's own races: tests/engine/test_single_flight.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperexport.base.contracts.names import STAGE_NAMES


@pytest.mark.slow
def test_two_cli_builds_on_one_empty_cache_compute_each_stage_once(tmp_path: Path) -> None:
    """The real pipeline through the command line, two processes started together."""
    from tests.helpers.cli import REPO, write_toy

    toy = write_toy(tmp_path)
    paths = [str(tmp_path / "user"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hyperexport",
                f"recipe_file={toy}",
                f"build.cache_dir={tmp_path / 'cache'}",
                f"build.outputs_dir={tmp_path / name}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    statuses = []
    for name in ("a", "b"):
        report = json.loads((tmp_path / name / "toy" / "default" / "report.json").read_text())
        statuses += [s["status"] for s in report["stages"]]
    assert statuses.count("ran") == len(STAGE_NAMES), statuses  # each stage by one build
    model = Path("toy") / "default" / "model.onnx"
    assert (tmp_path / "a" / model).read_bytes() == (tmp_path / "b" / model).read_bytes()

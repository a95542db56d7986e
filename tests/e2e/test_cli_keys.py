"""Discovered dependencies as a user meets them: ``recipe_file=`` builds in fresh processes.

The in-process tests (``test_e2e_keys.py``) cover the same ground quickly; this one runs the
command line, where a new process really imports the edited helper.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MODEL = """
import torch

from hxc_helpers import act


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return act(self.fc(x)) + x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def make(seed: int = 0):
    torch.manual_seed(seed)
    return Net().eval()
"""
RECIPE = """\
# @package _global_
name: cli_keys
model: {_target_: hxc_model.make, seed: 0}
inputs:
  x: {shape: [2, 8], dtype: float32, low: -1.0, high: 1.0}
hiera: [hxc_model.Block]
dynamo: false
rewrite: {optimize: false, fuse_constants: false}
"""


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "user"), *sys.path])}
    env.pop("HYPEREXPORT_CACHE_DIR", None)
    build = [f"build.cache_dir={root / 'cache'}", f"build.outputs_dir={root / 'outputs'}"]
    recipe = f"recipe_file={root / 'user' / 'cli_keys.yaml'}"
    return subprocess.run(
        [sys.executable, "-m", "hyperexport", recipe, *args, *build],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_helper_edit_reruns_and_the_dry_run_names_it(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "hxc_model.py").write_text(MODEL)
    helper = user / "hxc_helpers.py"
    helper.write_text("import torch\n\n\ndef act(x):\n    return torch.relu(x)\n")
    (user / "cli_keys.yaml").write_text(RECIPE)
    out = tmp_path / "outputs" / "cli_keys" / "default"
    cold = _run(tmp_path)
    assert cold.returncode == 0, cold.stderr
    before = (out / "model.onnx").read_bytes()
    helper.write_text(helper.read_text().replace("torch.relu", "torch.sigmoid"))
    plan = _run(tmp_path, "build.dry_run=true")
    assert plan.returncode == 0, plan.stderr
    assert "trace: would run (model code changed (hxc_helpers.py))" in plan.stdout
    again = _run(tmp_path)
    assert again.returncode == 0, again.stderr
    report = json.loads((out / "report.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["ran"] * 6
    assert report["check"]["ok"] is True  # ONNX Runtime matches torch with the new helper
    assert (out / "model.onnx").read_bytes() != before

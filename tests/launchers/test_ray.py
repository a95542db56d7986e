"""A sweep through ``hydra/launcher=ray`` (hydra-ray-launcher) on a local Ray head.

Two jobs of the same variant run at once as Ray tasks on one cache and one outputs folder: one
builds each stage, the other waits for it and reuses it (single flight across jobs). The head is
``ray start --head`` on 127.0.0.1 (tests/launchers/ray_head.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, run
from tests.launchers.gated import GateKeeper, assert_built_once, write_gated_toy
from tests.launchers.ray_head import RayHead, ray_head


@pytest.fixture
def head(tmp_path: Path) -> Iterator[RayHead]:
    # The workers import the user's model package and the checkout under test, like run() does.
    paths = [str(tmp_path / "user"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    with ray_head(paths) as running:
        yield running


@pytest.mark.slow
def test_ray_jobs_of_one_variant_build_each_stage_once(head: RayHead, tmp_path: Path) -> None:
    recipe, gate = write_gated_toy(tmp_path)
    keeper = GateKeeper(gate, head.worker_logs)
    keeper.start()
    args = [
        "-m",
        "hydra/launcher=ray",
        f"hydra.launcher.ray.init.address={head.address}",
        # Ray refuses object_store_memory when it joins a running cluster; the launcher sets it
        # unless the key is there.
        "+hydra.launcher.ray.init.object_store_memory=null",
        "+hydra.launcher.ray.remote.num_cpus=1",
    ]
    proc = run([*args, f"recipe_file={recipe}", "opset=17,17"], tmp_path)
    keeper.finish()
    logs = "\n".join(p.read_text(errors="replace") for p in head.worker_logs())
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert not keeper.missed, keeper.missed
    # The jobs ran at once: one was inside the model's factory while the other waited.
    assert len(keeper.waiting_logs) == 1, keeper.waiting_logs
    # One process (a Ray worker, not the launching process) built the model; each stage ran in
    # one job and was a hit in the other.
    assert_built_once(tmp_path, gate, "ray_worker")

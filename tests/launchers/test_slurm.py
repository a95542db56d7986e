"""A sweep through ``hydra/launcher=submitit_slurm`` on a real, single-node SLURM cluster.

Two jobs of the same variant run at once as SLURM jobs on one cache and one outputs folder:
one builds each stage, the other waits for it and reuses it (single flight across jobs).
The cluster is this machine on the loopback address (tests/launchers/slurm_cluster.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import run
from tests.launchers.gated import GateKeeper, assert_built_once, write_gated_toy
from tests.launchers.slurm_cluster import SlurmCluster, slurm_cluster


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with slurm_cluster() as running:
        if running.cpus < 2:
            pytest.skip(f"the node has {running.cpus} CPU; two jobs must run at once")
        monkeypatch.setenv("SLURM_CONF", str(running.conf))
        yield running


def submitit_logs(tmp_path: Path) -> list[Path]:
    """The jobs' stderr files, which submitit keeps in ``<sweep folder>/.submitit/<job id>/``."""
    return sorted((tmp_path / "outputs" / ".sweeps").glob("*/.submitit/*/*_log.err"))


@pytest.mark.slow
def test_slurm_jobs_of_one_variant_build_each_stage_once(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    recipe, gate = write_gated_toy(tmp_path)
    keeper = GateKeeper(gate, lambda: submitit_logs(tmp_path))
    keeper.start()
    args = ["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.cpus_per_task=1"]
    proc = run(
        [*args, "hydra.launcher.timeout_min=20", f"recipe_file={recipe}", "opset=17,17"], tmp_path
    )
    keeper.finish()
    logs = "\n".join(p.read_text(errors="replace") for p in submitit_logs(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert not keeper.missed, keeper.missed
    # Both jobs ran on the cluster (submitit names their folders by SLURM job id), at once:
    # one was inside the model's factory while the other waited for the trace key's lock.
    assert len({p.parent.name for p in submitit_logs(tmp_path)}) == 2
    assert len(keeper.waiting_logs) == 1, keeper.waiting_logs
    # One process, inside a SLURM job, built the model; each stage ran in one job and was a hit
    # in the other.
    assert_built_once(tmp_path, gate, "slurm_job_id")

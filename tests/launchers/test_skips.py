"""Where an engine cannot start, its test skips and says why (fast: no engine is started)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.launchers import ray_head, slurm_cluster
from tests.launchers.daemons import Daemon, wait_for


def skip_reason(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value.msg)  # type: ignore[attr-defined]


def test_a_daemon_that_dies_skips_with_its_last_log_line(tmp_path: Path) -> None:
    cmd = ["sh", "-c", "echo starting; echo 'fatal: no such plugin' >&2; exit 3"]
    daemon = Daemon.start("slurmd", cmd, tmp_path / "slurmd.log", dict(os.environ))
    daemon.proc.wait()
    with pytest.raises(pytest.skip.Exception) as excinfo:
        wait_for(lambda: False, [daemon], "the node idle")
    assert skip_reason(excinfo) == "slurmd exited with code 3: fatal: no such plugin"


def test_a_daemon_that_never_gets_ready_skips_naming_what_it_waited_for(tmp_path: Path) -> None:
    daemon = Daemon.start(
        "slurmctld", ["sh", "-c", "echo listening; sleep 60"], tmp_path / "l", dict(os.environ)
    )
    try:
        # The event the message reports: the daemon has written its line (never a time window).
        deadline = time.monotonic() + 60
        while "listening" not in daemon.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pytest.skip.Exception) as excinfo:
            wait_for(lambda: False, [daemon], "the node idle", timeout=0.0)
    finally:
        daemon.stop()
    assert skip_reason(excinfo) == "the node idle not within 0 s (slurmctld: listening)"
    assert daemon.proc.returncode is not None  # stop() ended it


def test_without_slurm_binaries_the_cluster_skips_naming_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception) as excinfo, slurm_cluster.slurm_cluster():
        pass
    assert skip_reason(excinfo).startswith("SLURM is not installed (mungekey, munged, slurmctld")
    assert "apt-get install slurm-wlm munge" in skip_reason(excinfo)


def test_not_as_root_the_cluster_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_cluster.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_cluster.os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception) as excinfo, slurm_cluster.slurm_cluster():
        pass
    assert skip_reason(excinfo).startswith("a test SLURM cluster needs root")


def test_without_ray_the_head_skips_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(pytest.skip.Exception) as excinfo, ray_head.ray_head([]):
        pass
    assert skip_reason(excinfo).startswith("ray cannot be imported")
    assert 'pip install -e ".[ray]"' in skip_reason(excinfo)

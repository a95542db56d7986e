"""A local Ray head on 127.0.0.1, started and stopped by a test.

``ray start --head --block`` runs in its own process group with its own temporary folder; the
test connects with ``ray.init(address=127.0.0.1:<port>)`` and stops the group at the end. Ray's
workers inherit the head's environment, so ``PYTHONPATH`` (the user's model package and the
checkout under test) is set when the head starts. Where Ray cannot start the test skips, saying
why (Ray or hydra-ray-launcher missing, or the last line of the head's log).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launchers.daemons import Daemon, free_port, wait_for

INSTALL = 'pip install -e ".[ray]" (docs/launchers.md, "Ray")'


@dataclass(frozen=True)
class RayHead:
    """A running head: its address and the folder that holds its sessions' logs."""

    address: str
    temp_dir: Path

    def worker_logs(self) -> list[Path]:
        """The workers' stderr files (a Ray task's log lines land there)."""
        return sorted(self.temp_dir.glob("session_latest/logs/worker-*.err"))


@contextmanager
def ray_head(pythonpath: list[str], cpus: int = 2) -> Iterator[RayHead]:
    """Start a head with ``cpus`` CPUs; on exit stop its process group and every process left."""
    for module in ("ray", "hydra_plugins.hydra_ray_launcher"):
        try:
            __import__(module)
        except ImportError as e:
            pytest.skip(f"{module} cannot be imported ({e}); {INSTALL}")
    # A short folder: Ray's unix sockets live under it (108 bytes at most).
    temp_dir = Path(tempfile.mkdtemp(prefix="hx-ray-"))
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={cpus}",
        "--include-dashboard=false", f"--temp-dir={temp_dir}", "--disable-usage-stats",
        "--object-store-memory=200000000",
    ]  # fmt: skip
    head = Daemon.start("ray start --head", cmd, temp_dir / "head.log", env)
    try:
        wait_for(
            lambda: "Ray runtime started" in head.log.read_text(errors="replace"),
            [head],
            "the Ray head",
            timeout=120,
        )
        yield RayHead(f"127.0.0.1:{port}", temp_dir)
    finally:
        head.stop()
        _kill_left_over(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_left_over(temp_dir: Path) -> None:
    """SIGKILL, by pid, processes of this head that left its group (they name its folder)."""
    mine = str(temp_dir).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
        if mine in cmdline:
            os.kill(int(proc.name), signal.SIGKILL)

"""A single-node SLURM cluster on the loopback address, started and stopped by a test.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``), run as root: a munge
key and daemon, ``slurm.conf``, state, spool and logs all live in one temporary folder; the one
node is this machine with the CPUs and memory ``slurmd -C`` reports. Clients (``sbatch``,
``squeue``, so submitit) find the cluster through ``SLURM_CONF``. Where the engine cannot start
the test skips, saying why (a missing binary, not root, or a daemon's last log line).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.launchers.daemons import Daemon, free_port, wait_for

BINARIES = ("mungekey", "munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
INSTALL = "apt-get install slurm-wlm munge"

CONF = """\
ClusterName=hx
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
{node}
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: its folder, ``slurm.conf`` and the node's CPUs."""

    root: Path
    conf: Path
    cpus: int


def this_node() -> tuple[str, int]:
    """The ``NodeName`` line for this machine (``slurmd -C``), named localhost; and its CPUs."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(f.split("=", 1) for f in out.splitlines()[0].split())
    fields.pop("NodeName")
    described = " ".join(f"{k}={v}" for k, v in fields.items())
    return f"NodeName=localhost NodeAddr=127.0.0.1 {described} State=UNKNOWN", int(fields["CPUs"])


@contextmanager
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd; on exit cancel every job and stop all three."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} not found; {INSTALL})")
    if os.geteuid() != 0:
        pytest.skip("a test SLURM cluster needs root (slurmd starts jobs as their user)")
    # A short folder: munge's socket path must fit in a unix socket address (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="hx-slurm-"))
    root.chmod(0o755)
    for sub in ("munge", "state", "spool", "run", "log"):
        (root / sub).mkdir()
    daemons: list[Daemon] = []
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    try:
        key, sock = root / "munge" / "munge.key", root / "munge" / "munge.socket"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
        munged = [
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
            f"--pid-file={root / 'run' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'seed'}",
            f"--log-file={root / 'log' / 'munged.log'}",
        ]  # fmt: skip
        daemons.append(Daemon.start("munged", munged, root / "log" / "munged.out", env))
        wait_for(sock.exists, daemons, "munged's socket")
        node, cpus = this_node()
        conf = CONF.format(
            root=root, munge_socket=sock, node=node, ctld_port=free_port(), d_port=free_port()
        )
        (root / "slurm.conf").write_text(conf)
        log = root / "log"
        daemons.append(
            Daemon.start("slurmctld", ["slurmctld", "-D", "-c"], log / "slurmctld.log", env)
        )
        daemons.append(
            Daemon.start("slurmd", ["slurmd", "-D", "-N", "localhost"], log / "slurmd.log", env)
        )
        wait_for(lambda: _node_state(env) == "idle", daemons, "the node localhost idle")
        yield SlurmCluster(root, root / "slurm.conf", cpus)
    finally:
        if len(daemons) == 3 and daemons[1].proc.poll() is None:
            _cancel_all(env)
        for daemon in reversed(daemons):
            daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


def _node_state(env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["sinfo", "-h", "-n", "localhost", "-o", "%t"], env=env, capture_output=True, text=True
    )
    return proc.stdout.strip()


def _cancel_all(env: dict[str, str]) -> None:
    """Cancel this cluster's jobs and wait (up to a minute) until none is left."""
    subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True)
        if queue.returncode != 0 or not queue.stdout.strip():
            return
        time.sleep(1)

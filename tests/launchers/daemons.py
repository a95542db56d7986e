"""Daemons a launcher test starts and stops itself: a log file each, stopped by their own pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Daemon:
    """One process started in the foreground, its stdout and stderr in ``log``."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, cmd: list[str], log: Path, env: dict[str, str]) -> Daemon:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return cls(name, proc, log)

    def last_line(self) -> str:
        """The last non-empty line of the daemon's log (what to say when it fails)."""
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        return lines[-1].strip() if lines else "(its log is empty)"

    def skip_if_dead(self) -> None:
        if self.proc.poll() is not None:
            pytest.skip(f"{self.name} exited with code {self.proc.returncode}: {self.last_line()}")

    def stop(self) -> None:
        """SIGTERM to this daemon's process group (it started it), SIGKILL after 20 s."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_for(
    ready: Callable[[], bool], daemons: list[Daemon], what: str, timeout: float = 60.0
) -> None:
    """Poll ``ready``; skip naming the daemon's last log line if one dies or time runs out."""
    deadline = time.monotonic() + timeout
    while not ready():
        for daemon in daemons:
            daemon.skip_if_dead()
        if time.monotonic() > deadline:
            last = "; ".join(f"{d.name}: {d.last_line()}" for d in daemons)
            pytest.skip(f"{what} not within {timeout:.0f} s ({last})")
        time.sleep(0.5)


def free_port() -> int:
    """A TCP port on the loopback address that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port

"""A test's build in a process of its own (``python -m <driver module> ...``), for the tests that
kill or race real builds, and reading that process's output until a line shows up; whether a
test may give such a process filesystems of its own (a private mount namespace)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

#: The repository: the drivers run from here, importable as ``tests.*``.
REPO = Path(__file__).resolve().parents[2]


def driver_env() -> dict[str, str]:
    """The environment of a driver process: this one's, with the repository on the path. A test
    that runs a driver another way gives it this too: the stages that run user code are keyed by
    the modules they load, so two builds that should hit each other load from the same path."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def start_module(module: str, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m module *args`` from the repository (pipes: text)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=driver_env(),
        cwd=REPO,
    )


def wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> None:
    """Read ``proc``'s stdout until a line contains ``text``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{text!r} never printed")


@functools.cache
def private_mounts_refusal() -> str | None:
    """Why this machine cannot run a process in a mount namespace of its own (``unshare -m``,
    where a test mounts a read-only or a small filesystem), or None when it can."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m is not permitted: {probe.stderr}"


def run_in_private_mounts(script: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the shell ``script`` in a mount namespace of its own (``unshare -m``: what it mounts is
    gone when it ends) from the repository, with :func:`driver_env` (pipes: text)."""
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=driver_env(),
        cwd=REPO,
        timeout=timeout,
    )

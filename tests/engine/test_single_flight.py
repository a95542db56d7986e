"""Single flight: builds that need the same missing entry compute it once (issue 11, item 2).

Real processes race on one empty cache (``driver.py``); each prints its stages' statuses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import filelock
import pytest

from hyperexport.engine import process_locks
from tests.engine.driver import start
from tests.helpers.driver_process import wait_for_line


def _result(proc: subprocess.Popen[str]) -> dict[str, dict[str, str]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_on_one_empty_cache_compute_each_stage_once(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Every stage takes a moment, so the two builds overlap on every key.
    first = start(cache, "--delay", "0.5")
    second = start(cache, "--delay", "0.5")
    results = [_result(first), _result(second)]
    statuses = [s for r in results for s in r["stages"].values()]
    assert statuses.count("ran") == 4, results
    assert statuses.count("hit") == 4, results
    assert results[0]["keys"] == results[1]["keys"]  # one entry per stage, both use it


def test_a_killed_holder_releases_the_key(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    holder = start(cache, "--delay", "60", "--slow", "trace")
    wait_for_line(holder, "running trace")  # holds the trace key's lock, for a minute
    waiter = start(cache)
    time.sleep(1.0)
    assert waiter.poll() is None, "the second build waits for the holder"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    result = _result(waiter)
    assert result["stages"] == {"trace": "ran", "export": "ran", "rewrite": "ran", "check": "ran"}


def test_single_flight_waits_for_the_holder(tmp_path: Path) -> None:
    order: list[str] = []
    with process_locks.single_flight(tmp_path, "ab" * 32, "stage x"):

        def other() -> None:
            with process_locks.single_flight(tmp_path, "ab" * 32, "stage x"):
                order.append("other")

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.3)
        order.append("holder")
    thread.join(timeout=10)
    assert order == ["holder", "other"]


def test_scratch_is_live_while_its_holder_lives(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp" / "build-x"
    scratch.mkdir(parents=True)
    lock_path = process_locks.scratch_lock_path(tmp_path, scratch)
    lock_path.parent.mkdir(parents=True)
    code = (
        f"import filelock, time; lock = filelock.FileLock({str(lock_path)!r}); lock.acquire(); "
        "print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert process_locks.scratch_is_live(tmp_path, scratch)
        assert process_locks.remove_dead_scratch(tmp_path) == []
        assert scratch.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert not process_locks.scratch_is_live(tmp_path, scratch)
    assert process_locks.remove_dead_scratch(tmp_path) == [scratch]
    assert not scratch.exists() and not lock_path.exists()


def test_locks_are_filelock_files_under_the_cache(tmp_path: Path) -> None:
    with process_locks.single_flight(tmp_path, "cd" * 32, "stage y"):
        path = process_locks.key_lock_path(tmp_path, "cd" * 32)
        assert path.is_relative_to(tmp_path / "locks")
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(path).acquire(timeout=0)
    filelock.FileLock(path).acquire(timeout=0)  # released on exit

"""bench/memwatch.py: anonymous memory counts, mapped file pages do not, children are summed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# Allocates and touches N MiB of anonymous memory, holds it, frees it.
_ALLOCATE = """
import sys, time
block = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
time.sleep(1.0)
"""
# Maps a file of N MiB and reads every page: resident, but file-backed.
_MAP = """
import mmap, sys, time
with open(sys.argv[2], "rb") as f:
    view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
total = sum(view[i] for i in range(0, len(view), 4096))
time.sleep(1.0)
"""
# Runs the allocating script in a child and a grandchild at once.
_TREE = """
import subprocess, sys
script = sys.argv[1]
inner = [sys.executable, "-c", script, sys.argv[2]]
outer = [sys.executable, "-c", "import subprocess,sys; subprocess.run(sys.argv[1:], check=True)"]
a = subprocess.Popen(inner)
b = subprocess.Popen(outer + inner)
assert a.wait() == 0 and b.wait() == 0
"""


def _watch(*command: str, timeline: Path | None = None) -> dict:
    extra = ["--timeline", str(timeline)] if timeline else []
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "memwatch.py"),
            "--interval",
            "0.05",
            *extra,
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _baseline() -> dict:
    return _watch(sys.executable, "-c", "import time; time.sleep(0.5)")


def test_anonymous_memory_is_measured() -> None:
    base = _baseline()["peak_anon_bytes"]
    figures = _watch(sys.executable, "-c", _ALLOCATE, "300")
    assert figures["exit"] == 0 and figures["samples"] >= 5
    grown = figures["peak_anon_bytes"] - base
    assert 290 * MIB < grown < 330 * MIB, grown / MIB
    assert figures["peak_rss_bytes"] >= figures["peak_anon_bytes"] - 8 * MIB


def test_mapped_file_pages_are_rss_but_not_anonymous(tmp_path: Path) -> None:
    data = tmp_path / "weights.bin"
    with open(data, "wb") as f:
        f.write(b"\1" * (300 * MIB))
    base = _baseline()
    figures = _watch(sys.executable, "-c", _MAP, "0", str(data))
    assert figures["peak_anon_bytes"] - base["peak_anon_bytes"] < 30 * MIB
    assert figures["peak_rss_bytes"] - base["peak_rss_bytes"] > 250 * MIB


def test_the_process_tree_is_summed(tmp_path: Path) -> None:
    base = _baseline()["peak_anon_bytes"]
    timeline = tmp_path / "timeline.jsonl"
    figures = _watch(sys.executable, "-c", _TREE, _ALLOCATE, "200", timeline=timeline)
    assert figures["exit"] == 0
    # Two 200 MiB children at once, plus the interpreters of the tree (about 5 of them).
    assert figures["peak_anon_bytes"] - base > 390 * MIB
    samples = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert max(s["processes"] for s in samples) >= 4
    assert max(s["anon"] for s in samples) == figures["peak_anon_bytes"]


def test_the_exit_code_is_the_commands() -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "memwatch.py"),
            "--",
            sys.executable,
            "-c",
            "raise SystemExit(3)",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 3
    assert json.loads(result.stdout.strip().splitlines()[-1])["exit"] == 3


def test_the_timeline_counts_cpu_seconds(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.jsonl"
    busy = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    figures = _watch(sys.executable, "-c", busy, timeline=timeline)
    samples = [json.loads(line) for line in timeline.read_text().splitlines()]
    cpu = [s["cpu"] for s in samples]
    assert cpu == sorted(cpu)  # cumulative over the tree's life
    assert 0.3 < cpu[-1] <= figures["cpu_s"] + 0.05


def _filesystem_type(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it)."""
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fs_type, *_ = line.split()
        mount = mount.replace("\\040", " ")
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fs_type
    return kind


def test_the_bytes_written_to_storage_are_counted(tmp_path: Path) -> None:
    if _filesystem_type(tmp_path) == "tmpfs":
        pytest.skip("the temporary folder is on tmpfs, whose writes never reach storage")
    target = tmp_path / "written.bin"
    write = (
        "import os, sys\n"
        "with open(sys.argv[1], 'wb') as f:\n"
        "    f.write(os.urandom(64 << 20)); f.flush(); os.fsync(f.fileno())\n"
    )
    figures = _watch(sys.executable, "-c", write, str(target))
    assert 0.064 <= figures["written_gb"] < 0.2  # 64 MiB = 0.067 GB, and little else
    quiet = _watch(sys.executable, "-c", "pass")
    assert quiet["written_gb"] < 0.01

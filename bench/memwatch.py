"""Run a command and sample its memory from ``/proc``: peak anonymous memory and peak RSS.

    python bench/memwatch.py [--interval 0.2] [--timeline FILE] -- CMD ARGS...

Every ``--interval`` seconds this reads ``/proc/<pid>/status`` of the command and of every
process below it (children, grandchildren: the tree is found afresh at each sample from the
parent ids in ``/proc/*/stat``) and sums, over the tree:

* **anonymous memory**: ``RssAnon + VmSwap``, the memory the processes own. Pages of mapped
  files (``RssFile``: a memory-mapped checkpoint, ONNX Runtime reading external data in place)
  do not count: the kernel can drop them and read them again.
* **RSS**: ``VmRSS`` (= ``RssAnon + RssFile + RssShmem``), what ``/usr/bin/time`` reports as the
  maximum resident set (of one process; here summed over the tree).

When the command exits it prints one JSON line: the command's exit code, wall seconds, the
tree's CPU seconds (user + system of every child reaped, from ``wait4``), both peaks (bytes and
GB, and the time of the anonymous peak), the kernel's own ``ru_maxrss`` of the largest child,
the bytes the tree wrote to storage (``ru_oublock`` x 512 from the same ``wait4``: what the
processes' writes dirtied in the page cache, counted when written, whether or not a file was
deleted before the disk took it), and the number of samples. With ``--timeline`` every sample is appended to FILE as a JSON line
(``t``, ``anon``, ``rss``, ``processes``), to line the peaks up with a build's stage log.

A sampler misses what lives for less than an interval; ``ru_maxrss`` (exact, but total RSS and
per process) is printed beside it for that reason. Exit code: the command's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

#: Default sampling interval in seconds.
INTERVAL = 0.2


def _status(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status`` in bytes ({} once the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0]) * 1024
    return fields


def _parents() -> dict[int, int]:
    """``pid -> parent pid`` of every process (``/proc/<pid>/stat``'s fourth field)."""
    parents = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may hold spaces or parentheses.
        rest = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(rest[1])
    return parents


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and of its waited-for children (0 once gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    rest = stat[stat.rfind(")") + 2 :].split()  # rest[0] is field 3 (state)
    return sum(int(v) for v in rest[11:15]) / _TICKS  # utime, stime, cutime, cstime


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it, now."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, ()))
    return tree


@dataclass(frozen=True)
class Sample:
    """Memory of a process tree at one moment, in bytes."""

    t: float
    anon: int
    rss: int
    processes: int
    cpu: float = 0.0  # CPU seconds of the live tree so far (to attribute CPU to a build's stages)


def sample(root: int, started: float) -> Sample:
    """Sum ``RssAnon + VmSwap`` and ``VmRSS`` over ``root``'s process tree."""
    anon = rss = count = 0
    cpu = 0.0
    for pid in process_tree(root):
        status = _status(pid)
        if not status:
            continue
        count += 1
        anon += status.get("RssAnon", 0) + status.get("VmSwap", 0)
        rss += status.get("VmRSS", 0)
        cpu += _cpu_seconds(pid)
    return Sample(round(time.monotonic() - started, 3), anon, rss, count, round(cpu, 2))


@dataclass
class Peaks:
    """The highest samples seen so far."""

    anon: int = 0
    rss: int = 0
    anon_at: float = 0.0
    samples: int = 0
    timeline: list[Sample] = field(default_factory=list)

    def add(self, s: Sample) -> None:
        self.samples += 1
        if s.anon > self.anon:
            self.anon, self.anon_at = s.anon, s.t
        self.rss = max(self.rss, s.rss)


class Sampler:
    """Samples a process tree on a thread until stopped (also usable on this process).

    Args:
        root: The pid at the top of the tree.
        interval: Seconds between samples.
        timeline: Where to append every sample as a JSON line, or None.
    """

    def __init__(self, root: int, interval: float = INTERVAL, timeline: IO[str] | None = None):
        self.root = root
        self.interval = interval
        self.peaks = Peaks()
        self._timeline = timeline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._started = time.monotonic()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            s = sample(self.root, self._started)
            if s.processes:
                self.peaks.add(s)
                if self._timeline is not None:
                    self._timeline.write(json.dumps(asdict(s)) + "\n")
                    self._timeline.flush()
            if self._stop.wait(self.interval):
                return


def run(command: Sequence[str], interval: float = INTERVAL, timeline: Path | None = None) -> dict:
    """Run ``command`` to its end while sampling its process tree; the figures as a dict."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(timeline, "a", encoding="utf-8")) if timeline else None
        child = subprocess.Popen(list(command))
        # Forward an interrupt to the command instead of leaving it orphaned.
        previous = signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
        stack.callback(signal.signal, signal.SIGINT, previous)
        with Sampler(child.pid, interval, sink) as sampler:
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    peaks = sampler.peaks
    return {
        "exit": child.returncode,
        "wall_s": round(time.monotonic() - started, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_anon_bytes": peaks.anon,
        "peak_anon_gb": round(peaks.anon / 1e9, 3),
        "peak_anon_at_s": peaks.anon_at,
        "peak_rss_bytes": peaks.rss,
        "peak_rss_gb": round(peaks.rss / 1e9, 3),
        "maxrss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),
        "written_gb": round(usage.ru_oublock * 512 / 1e9, 3),
        "samples": peaks.samples,
        "interval_s": interval,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=INTERVAL)
    parser.add_argument("--timeline", type=Path, help="append every sample here (JSON lines)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (python bench/memwatch.py -- CMD ARGS...)")
    figures = run(command, args.interval, args.timeline)
    print(json.dumps({"command": command, **figures}), flush=True)
    return int(figures["exit"])


if __name__ == "__main__":
    sys.exit(main())

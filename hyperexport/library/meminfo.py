"""The memory the system reports as available (``/proc/meminfo``), and this process's anonymous
memory (``/proc/self/status``)."""

from __future__ import annotations

from pathlib import Path


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` in bytes, or None where the system does not report it."""
    try:
        text = meminfo.read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def anonymous_memory(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's anonymous memory in bytes: ``RssAnon`` plus ``VmSwap`` (mapped file pages,
    a checkpoint's memory map among them, do not count), or None where the system does not
    report it."""
    try:
        text = status.read_text(encoding="ascii")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if "RssAnon" not in fields:
        return None
    return sum(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "VmSwap") if k in fields)

"""Byte counts as people read them: ``1536`` -> ``"1.5 KiB"`` (binary multiples, as ``du -h``)."""

from __future__ import annotations


def human_size(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``; bytes below 1 KiB are shown exactly (``"512 B"``)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")

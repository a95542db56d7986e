"""Plain-text tables for command output: one line per row, columns aligned, suitable for logs."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; trailing spaces are stripped.

    Example: ``render_table(["KEY", "SIZE"], [["ab12", "1.0 KiB"]])`` ->
    ``["KEY   SIZE", "ab12  1.0 KiB"]``.
    """
    widths = [len(h) for h in header]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {list(row)} has {len(row)} cells for {len(header)} columns")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *rows)
    ]

"""Escaped HTML pieces of ``report.html``: text, a status word, a number cell, a table."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def status(ok: Any) -> str:
    return '<span class="ok">ok</span>' if ok else '<span class="bad">FAILED</span>'


def num_cell(value: Any) -> str:
    return (
        f'<td class="num">{value:.3g}</td>'
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else "<td>-</td>"
    )


def table(head: Sequence[str], rows: Sequence[str], table_id: str = "") -> str:
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    ident = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{ident}><tr>{header}</tr>{''.join(rows)}</table>" if rows else "<p>none</p>"

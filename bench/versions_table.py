"""The "Tested versions" table (docs/versions.md), generated from the matrix's result files.

    nox -s "leg(torch-2.9.1)"           # run one leg (noxfile.py): writes bench/versions/<leg>.json
    python bench/versions_table.py      # rewrite the table of docs/versions.md from bench/versions/*.json

Each row is one leg that was really run: the versions it installed, what its default tests and
its zoo run (``-m zoo``, both export paths) gave, their wall times, and the whole leg's (its
install included). A leg without a result
file is not in the table. ``tests/base/test_versions_table.py`` fails when the table in the docs differs
from what this script renders from the committed results.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TABLE_DOC = REPO / "docs" / "versions.md"
RESULTS = REPO / "bench" / "versions"
START, END = "<!-- versions-table:start -->", "<!-- versions-table:end -->"
COLUMNS = ("torch", "transformers", "onnxscript", "onnx", "onnx-ir", "onnxruntime", "numpy")
#: Rows in this order; other legs after them, by name.
ORDER = ("pinned", "cheap", "floors")


def load_results(directory: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """``{leg: result}`` from every ``<leg>.json`` in ``directory``."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _outcome(run: dict[str, Any] | None) -> str:
    if run is None:
        return "not run"
    parts = [f"{run[k]} {k}" for k in ("failed", "passed", "xfailed", "skipped") if run[k]]
    return ", ".join(parts) + f" ({run['wall_seconds'] // 60} min)"


def _leg_wall(result: dict[str, Any]) -> str:
    """The whole leg: its install, its default tests and its zoo, in minutes."""
    seconds = result.get("setup_seconds", 0) + sum(
        (result.get(part) or {}).get("wall_seconds", 0) for part in ("default", "zoo")
    )
    return f"{seconds / 60:.0f} min"


def _version(result: dict[str, Any], name: str) -> str:
    version = str(result["installed"][name])
    return f"**{version}**" if name in result["pins"] else version


def render_table(results: dict[str, dict[str, Any]]) -> str:
    """The markdown table: one row per leg, pinned versions in bold."""
    legs = [leg for leg in ORDER if leg in results]
    legs += sorted(set(results) - set(ORDER))
    pythons = sorted({results[leg]["python"] for leg in legs})
    header = ["leg", "commit", *COLUMNS, "default tests", "zoo (`-m zoo`)", "leg wall"]
    lines = [
        f"Python {', '.join(pythons)} only (the one Python on the machine that ran them); "
        "bold: what the leg varies from the pinned stack.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    for leg in legs:
        result = results[leg]
        cells = [
            f"`{leg}`",
            str(result.get("commit", "?")),
            *(_version(result, name) for name in COLUMNS),
            _outcome(result["default"]),
            _outcome(result.get("zoo")),
            _leg_wall(result),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def doc_table(text: str) -> str:
    """What the doc holds between the markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def write_doc(table: str) -> None:
    """Replace the table in the docs (atomically)."""
    text = TABLE_DOC.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    part = TABLE_DOC.with_suffix(".md.part")
    part.write_text(f"{head}{START}\n{table}\n{END}{tail}")
    os.replace(part, TABLE_DOC)


if __name__ == "__main__":
    write_doc(render_table(load_results()))
    print(f"wrote the table of {TABLE_DOC.relative_to(REPO)}")

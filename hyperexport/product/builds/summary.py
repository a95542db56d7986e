"""The human summary of a build: stages, the model path, the function tree and the check verdict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def function_tree(
    manifest: Mapping[str, Any], capture: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """Which class became which function, how many calls, and which function calls it.

    Args:
        manifest: ``ExportManifest.to_json()`` of the final model.
        capture: ``CaptureRecord.to_json()`` of the trace (for call nesting), if available.

    Returns:
        One entry per function, in first-call order: ``{"function", "class", "calls",
        "module_paths", "parent"}``; ``parent`` is the calling function or None (main graph).
    """
    parent_of_call: dict[str, str | None] = {}
    if capture is not None:
        for call in capture.get("calls", []):
            cid = f"{call['path']}#{call['call_index']}"
            parent_of_call[cid] = call.get("parent")
    function_of_call = {
        c["call_id"]: f"{c['domain']}::{c['name']}" for c in manifest.get("calls", [])
    }
    classes = {f"{f['domain']}::{f['name']}": f for f in manifest.get("functions", [])}
    tree: dict[str, dict[str, Any]] = {}
    for call in manifest.get("calls", []):
        fid = function_of_call[call["call_id"]]
        entry = tree.get(fid)
        if entry is None:
            info = classes.get(fid, {})
            parent_call = parent_of_call.get(call["call_id"])
            entry = tree[fid] = {
                "function": fid,
                "class": info.get("class_name", ""),
                "calls": 0,
                "module_paths": list(info.get("module_paths", [])),
                "parent": function_of_call.get(parent_call) if parent_call else None,
            }
        entry["calls"] += 1
    for fid, info in classes.items():  # functions with no recorded call still get listed
        tree.setdefault(
            fid,
            {
                "function": fid,
                "class": info.get("class_name", ""),
                "calls": 0,
                "module_paths": list(info.get("module_paths", [])),
                "parent": None,
            },
        )
    return list(tree.values())


def render_tree(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Indented lines ``Class → domain::function x calls``, children under their caller."""
    children: dict[str | None, list[Mapping[str, Any]]] = {}
    for e in entries:
        children.setdefault(e["parent"], []).append(e)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for e in children.get(parent, []):
            short = str(e["class"]).rsplit(".", 1)[-1] or "?"
            lines.append(f"{'  ' * depth}{short} → {e['function']} x{e['calls']}")
            if e["function"] != parent:
                walk(e["function"], depth + 1)

    walk(None, 1)
    return lines


def render_summary(report: Mapping[str, Any], check_lines: Sequence[str] = ()) -> list[str]:
    """The summary printed at the end of a build and saved as ``summary.txt``."""
    recipe = report.get("recipe", {})
    lines = [f"recipe: {recipe.get('name')} ({recipe.get('file')})", "stages:"]
    for s in report.get("stages", []):
        extra = f" ({s['reason']})" if s.get("reason") else ""
        lines.append(f"  {s['name']}: {s['status']}{extra} {s['seconds']:.2f}s")
    fallback = (report.get("export_path") or {}).get("fallback_from")
    if fallback:
        lines.append(f"fallback: exported on the other path after {fallback}")
    functions = report.get("functions") or []
    if functions:
        lines.append("functions (class → function x calls):")
        lines += render_tree(functions)
    if check_lines:
        lines.append("check:")
        lines += [f"  {line}" for line in check_lines]
    if report.get("error"):
        lines.append(f"error: {report['error']}")
    model = report.get("artifacts", {}).get("model")
    if model:
        lines.append(f"model: {model}")
    return lines

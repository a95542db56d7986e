"""The human summary of a build: stages, the function tree, the check verdict, the published
models with their sizes and fused ops, and the models' paths."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hyperexport.engine.spans import describe


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


def published_models(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every published model file (float, quantized, each graph of a task with several), with
    its size including its external data, from ``report.json``'s ``artifacts`` and ``files``.

    Returns:
        ``{"artifact", "path", "file", "size"}`` per model, in the report's artifact order
        (``model`` first); ``file`` is the path inside the publication.
    """
    artifacts = report.get("artifacts") or {}
    files = report.get("files") or {}
    models = []
    for name, path in artifacts.items():
        if name != "model" and not name.endswith("_model"):
            continue
        rel = next((f for f in files if str(path).endswith("/" + f) or path == f), None)
        if rel is None:
            continue
        size = sum(
            int(info.get("size") or 0)
            for f, info in files.items()
            if (f == rel or f.startswith(rel + ".")) and isinstance(info, Mapping)
        )
        models.append({"artifact": name, "path": str(path), "file": rel, "size": size})
    models.sort(key=lambda m: (m["artifact"] != "model", m["artifact"]))
    return models


def model_label(artifact: str, report: Mapping[str, Any]) -> str:
    """``float``, ``quantized <method>``, or the graph (``encoder``) of a published model."""
    if artifact == "model":
        return "float"
    if artifact == "quantized_model":
        method = ((report.get("recipe") or {}).get("config") or {}).get("quantize", {})
        method = method.get("method") if isinstance(method, Mapping) else None
        return f"quantized {method}" if method else "quantized"
    return artifact.removesuffix("_model")


def size_text(n: float) -> str:
    """``512 B``, ``1.5 KB``, ``3.2 MB`` (binary units)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def op_count_lines(counts: Mapping[str, Mapping[str, int]], what: str) -> list[str]:
    """``<what> ops in <function>: Op x3, ...`` per function of ``{function: {op: nodes}}``."""
    return [
        f"{what} ops in {function}: " + ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))
        for function, ops in sorted(counts.items())
        if ops
    ]


def render_summary(report: Mapping[str, Any], check_lines: Sequence[str] = ()) -> list[str]:
    """The summary printed at the end of a build and saved as ``summary.txt``.

    Its last line names the published models: ``model: <path>`` for one, else each path with
    what it is (``model: <float> (float), <quantized> (quantized int4_block)``).
    """
    recipe = report.get("recipe", {})
    lines = [f"recipe: {recipe.get('name')} ({recipe.get('file')})", "stages:"]
    for s in report.get("stages", []):
        extra = f" ({s['reason']})" if s.get("reason") else ""
        parts = f", {describe(s['spans'])}" if s.get("spans") else ""
        lines.append(f"  {s['name']}: {s['status']}{extra} {s['seconds']:.2f}s{parts}")
    fallback = (report.get("export_path") or {}).get("fallback_from")
    if fallback:
        lines.append(f"fallback: exported on the other path after {fallback}")
    functions = report.get("functions") or []
    if functions:
        lines.append("functions (class → function x calls):")
        lines += render_tree(functions)
    fused = op_count_lines((report.get("ops") or {}).get("fused") or {}, "fused")
    if fused:
        lines.append("ops:")
        lines += [f"  {line}" for line in fused]
    if check_lines:
        lines.append("check:")
        lines += [f"  {line}" for line in check_lines]
    if report.get("error"):
        lines.append(f"error: {report['error']}")
        if report.get("traceback"):
            lines.append("  an internal error, not a problem of the recipe: its traceback is")
            lines.append('  report.json\'s "traceback" (please include it in a bug report)')
    models = published_models(report)
    if models:
        lines.append("published models:")
        lines += [
            f"  {m['file']} ({model_label(m['artifact'], report)}): {size_text(m['size'])}"
            for m in models
        ]
    if len(models) == 1 and models[0]["artifact"] == "model":
        lines.append(f"model: {models[0]['path']}")
    elif models:
        named = ", ".join(f"{m['path']} ({model_label(m['artifact'], report)})" for m in models)
        lines.append(f"model: {named}")
    return lines

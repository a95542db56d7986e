"""The build's report: ``report.json`` (what ran, why, the artifacts, the check, the functions),
with ``summary.txt`` and ``report.html`` beside it, and scratch paths replaced by published ones.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import SEQ2SEQ_GRAPHS
from hyperexport.base.errors import HyperExportError, StageError
from hyperexport.engine.errors import StageFailed
from hyperexport.engine.hashing import atomic_write_json
from hyperexport.engine.runner import BuildRequest, BuildResult
from hyperexport.engine.stage import Stage
from hyperexport.engine.store import CacheStore
from hyperexport.product.builds.recipe_source import recipe_source
from hyperexport.product.builds.report_html import model_io, write_report_html
from hyperexport.product.builds.summary import function_tree

#: Artifact name prefixes of a build with several graphs (``encoder_manifest``, ...).
GRAPH_PREFIXES = tuple(f"{graph}_" for graph in SEQ2SEQ_GRAPHS)

#: Artifact names of the tasks' decode judgements, in ``report.json`` under ``decode``.
DECODE_CHECKS = ("generation_check", "seq2seq_check")

REPORT = "report.json"
SUMMARY = "summary.txt"
REPORT_FORMAT = 2


_SCRATCH_NAME = r"[^/\\\s'\"]+"


def replace_scratch_paths(text: str, store: CacheStore, link: Path) -> str:
    """Paths into a build's scratch checkouts become the published path of the same file."""
    pattern = re.escape(str(store.root / "tmp")) + rf"/{_SCRATCH_NAME}/{_SCRATCH_NAME}/"
    return re.sub(pattern, lambda _: str(link) + "/", text)


def fix_paths(value: Any, store: CacheStore, link: Path) -> Any:
    """:func:`replace_scratch_paths` in every string of a report."""
    if isinstance(value, str):
        return replace_scratch_paths(value, store, link)
    if isinstance(value, Mapping):
        return {k: fix_paths(v, store, link) for k, v in value.items()}
    if isinstance(value, list):
        return [fix_paths(v, store, link) for v in value]
    return value


def read_report(out_dir: Path) -> dict[str, Any] | None:
    """The ``report.json`` in ``out_dir``, or None if absent or unreadable."""
    try:
        data = json.loads((out_dir / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def artifact_text(
    store: CacheStore, stages: Sequence[Stage], result: BuildResult, name: str
) -> str | None:
    """The text of artifact ``name`` (a name of a stage's declared outputs for this build) from
    a successful stage, or from the failed stage's files."""
    for stage in stages:
        rel = result.declared.get(stage.name, {}).get(name)
        if rel is None:
            continue
        entry = result.entries.get(stage.name)
        if entry is not None:
            return store.read_text(entry, rel)
        if result.error is not None and result.error.stage == stage.name:
            return result.failed_files.get(rel)
    return None


def build_report(
    request: BuildRequest,
    result: BuildResult,
    store: CacheStore,
    out_dir: Path,
    files: Mapping[str, Mapping[str, Any]],
    *,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """The content of ``report.json``; artifact paths are under ``out_dir`` (the public link)."""
    artifacts = {}
    for stage in request.stages:
        for name, rel in result.declared.get(stage.name, {}).items():
            if rel in files:
                artifacts[name] = str(out_dir / rel)
    check_text = artifact_text(store, request.stages, result, "check")
    # One graph (``manifest``/``capture``), or several (``<graph>_manifest``/``<graph>_capture``,
    # the encoder-decoder tasks): functions and inputs/outputs of each, names prefixed.
    manifests, functions, io = [], [], None
    fused: dict[str, dict[str, int]] = {}
    for prefix in ("", *GRAPH_PREFIXES):
        manifest_text = artifact_text(store, request.stages, result, f"{prefix}manifest")
        capture_text = artifact_text(store, request.stages, result, f"{prefix}capture")
        if not manifest_text and not capture_text:
            continue
        capture = json.loads(capture_text) if capture_text else None
        graph = prefix.removesuffix("_")
        if manifest_text:
            manifests.append(json.loads(manifest_text))
            for f in manifests[-1].get("functions", []):
                if f.get("fused_ops"):
                    name = f"{f['domain']}::{f['name']}"
                    fused[f"{graph}/{name}" if graph else name] = dict(f["fused_ops"])
            tree = function_tree(manifests[-1], capture)
            functions += [{**f, "graph": graph} if graph else f for f in tree]
        if capture is not None:
            graph_io = model_io(capture)
            if graph:
                graph_io = {
                    side: [{**row, "name": f"{graph}/{row['name']}"} for row in rows]
                    for side, rows in graph_io.items()
                }
            io = graph_io if io is None else {k: io[k] + graph_io[k] for k in io}
    manifest = manifests[0] if manifests else None
    error = StageError.of(result.error) if result.error else None
    check = json.loads(check_text) if check_text else None
    quantized = (check or {}).get("quantized") or {}
    decodes = {
        name: json.loads(text)
        for name in DECODE_CHECKS
        if (text := artifact_text(store, request.stages, result, name))
    }
    return {
        "format": REPORT_FORMAT,
        "recipe": {
            "name": request.name,
            "file": request.source,
            # which recipe made it: a build of another source is refused (recipe_source.py)
            "source": recipe_source(request.source),
            "config": dict(request.config),
        },
        "overrides": list(overrides),
        "status": "ok" if result.ok else "failed",
        "error": str(error) if error else None,
        "failed_stage": error.stage if error else None,
        "module_path": error.module_path if error else None,
        "traceback": internal_traceback(result.error),
        "stages": [s.to_json() for s in result.stages],
        "artifacts": artifacts,
        "files": {k: dict(v) for k, v in sorted(files.items())},
        "check": check,
        # The task's judgement of its decode (generation_check.json, seq2seq_check.json), by name.
        "decode": decodes or None,
        # Op counts per function: the fused kernels (rewrite.fuse) and the quantized ops.
        "ops": {
            "fused": fused,
            "quantized": dict((quantized.get("comparison") or {}).get("ops") or {}),
        },
        "functions": functions,
        # The path that produced the model and, if the recipe's fallback was used, why.
        "export_path": {
            "dynamo": manifest.get("dynamo"),
            "fallback_from": manifest.get("fallback_from"),
        }
        if manifest
        else None,
        "environment": dict(request.env),
        "cache_dir": str(store.root),
        # The model's inputs and outputs with traced shapes and dtypes (report.html shows them).
        "io": io,
    }


def internal_traceback(failure: StageFailed | None) -> str | None:
    """The traceback of a stage's failure whose cause is none of hyperexport's typed errors (a
    bug, or a library failing where nothing expected it): the one line the summary prints names
    no place in the code, and a report of the bug needs one. None for a typed error, whose
    message says what is wrong and where."""
    if failure is None or isinstance(failure.cause, HyperExportError):
        return None
    return "".join(traceback.format_exception(failure.cause))


def write_report_files(directory: Path, report: Mapping[str, Any], summary: Sequence[str]) -> None:
    """Write ``summary.txt``, ``report.json`` then ``report.html`` (each atomically)."""
    atomic_write_bytes(directory / SUMMARY, ("\n".join(summary) + "\n").encode("utf-8"))
    atomic_write_json(directory / REPORT, report)
    write_report_html(directory, report)

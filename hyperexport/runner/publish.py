"""Materialise a build's artifacts under its outputs directory and write ``report.json``.

The outputs directory holds copies (never links into the cache) of the files each stage
publishes, plus ``report.json`` and ``summary.txt``. Files already there with the right digest
(size/mtime fast path) are not copied again, and files a previous build published that this one
does not are removed, so the directory always describes one build.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hyperexport.runner.hashing import atomic_write_bytes, atomic_write_json
from hyperexport.runner.runner import BuildRequest, BuildResult
from hyperexport.runner.stage import Stage
from hyperexport.runner.store import CacheStore
from hyperexport.runner.summary import function_tree, render_summary

log = logging.getLogger(__name__)

REPORT = "report.json"
SUMMARY = "summary.txt"
REPORT_FORMAT = 1


def publish_outputs(
    store: CacheStore, stages: Sequence[Stage], result: BuildResult, out_dir: Path
) -> dict[str, dict[str, Any]]:
    """Copy the published files of every successful stage to ``out_dir``.

    Returns:
        ``{relative path: {"digest", "size", "stage"}}`` of the published files.

    Raises:
        ValueError: A cached blob turned out corrupt while being copied (it has been removed).
    """
    published: dict[str, dict[str, Any]] = {}
    for stage in stages:
        entry = result.entries.get(stage.name)
        if entry is None:
            continue
        for f in entry.outputs:
            if not any(fnmatch.fnmatch(f.path, pattern) for pattern in stage.publish):
                continue
            target = out_dir / f.path
            if not (target.is_file() and store.index.digest(target) == f.digest):
                store.copy_blob(f, target)
                store.index.remember(target, f.digest)
            published[f.path] = {"digest": f.digest, "size": f.size, "stage": stage.name}
    _remove_stale(out_dir, published)
    store.save_index()
    return published


def _remove_stale(out_dir: Path, published: Mapping[str, Any]) -> None:
    previous = read_report(out_dir)
    for rel in (previous or {}).get("files", {}):
        if rel not in published and rel not in (REPORT, SUMMARY):
            path = out_dir / rel
            if path.is_file() and path.resolve().is_relative_to(out_dir.resolve()):
                log.info("removing %s (not produced by this build)", path)
                path.unlink()


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
    """The text of artifact ``name`` from a successful stage, or from the failed stage's files."""
    for stage in stages:
        rel = stage.artifacts.get(name)
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
    recipe_file: str | None,
) -> dict[str, Any]:
    """The content of ``report.json``."""
    artifacts = {}
    for stage in request.stages:
        for name, rel in stage.artifacts.items():
            if rel in files:
                artifacts[name] = str(out_dir / rel)
    check_text = artifact_text(store, request.stages, result, "check")
    manifest_text = artifact_text(store, request.stages, result, "manifest")
    capture_text = artifact_text(store, request.stages, result, "capture")
    manifest = json.loads(manifest_text) if manifest_text else None
    functions = (
        function_tree(manifest, json.loads(capture_text) if capture_text else None)
        if manifest
        else []
    )
    return {
        "format": REPORT_FORMAT,
        "recipe": {
            "name": request.recipe_name,
            "file": recipe_file,
            "config": dict(request.recipe),
        },
        "status": "ok" if result.ok else "failed",
        "error": str(result.error) if result.error else None,
        "failed_stage": result.error.stage if result.error else None,
        "module_path": result.error.module_path if result.error else None,
        "stages": [s.to_json() for s in result.stages],
        "artifacts": artifacts,
        "files": {k: dict(v) for k, v in sorted(files.items())},
        "check": json.loads(check_text) if check_text else None,
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
    }


def write_report(
    out_dir: Path, report: Mapping[str, Any], check_lines: Sequence[str] = ()
) -> list[str]:
    """Write ``report.json`` and ``summary.txt`` atomically; return the summary lines."""
    lines = render_summary(report, check_lines)
    atomic_write_bytes(out_dir / SUMMARY, ("\n".join(lines) + "\n").encode("utf-8"))
    atomic_write_json(out_dir / REPORT, report)
    return lines

"""Publish a build's artifacts as one directory that replaces the previous one atomically.

Layout under ``<outputs>/<recipe>/`` (documented in outputs/README.md)::

    <variant>                   symlink -> .builds/<variant>.<id>: the last good build
    <variant>.failed            symlink -> .builds/<variant>.failed.<id>: the last failed build,
                                removed by the next good build
    .builds/<variant>.<id>/     one complete publication: model, external data, manifest,
                                check.json, check.txt, report.json, summary.txt
    .builds/<variant>.<id>.lock held (filelock) while that publication is being written

A publication is written in full under ``.builds/`` (files cloned from the cache with
:func:`~hyperexport.runner.files.clone_or_copy` and verified by digest, or, for a large file the
build already copied out and verified, that copy moved in: ``workspace.py``), then the link is
swapped with one ``os.replace``: a reader that resolves the link sees the previous build or the
new one, never a mix, also when the build is killed at any point. The previous directory is
removed after the swap; directories left by killed builds (no link points at them and their lock
is free) are removed by the next publication in the same recipe folder.

A failed build never touches ``<variant>``: the last good artifact stays, and what the failed
build made (the failing model, its check and report) goes to ``<variant>.failed``, with the
scratch paths in its messages replaced by the published paths.

A no-op rebuild whose artifacts are already published (same digests) does not copy them again:
only ``report.json``, ``report.html`` and ``summary.txt`` of the current publication are replaced
(each atomically); they describe the same files.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from hyperexport.atomic import atomic_write_bytes
from hyperexport.runner.entries import OutputFile
from hyperexport.runner.files import clone_or_copy
from hyperexport.runner.hashing import atomic_write_json, sha256_file, sha256_text
from hyperexport.runner.report_html import model_io, write_report_html
from hyperexport.runner.runner import BuildRequest, BuildResult
from hyperexport.runner.stage import Stage
from hyperexport.runner.store import CacheStore
from hyperexport.runner.summary import function_tree, render_summary
from hyperexport.runner.workspace import Workspace

log = logging.getLogger(__name__)

REPORT = "report.json"
SUMMARY = "summary.txt"
REPORT_FORMAT = 2
BUILDS = ".builds"
FAILED_SUFFIX = ".failed"
_LOCK_SUFFIX = ".lock"
_ORPHAN_LOCK_AGE = 600.0  # seconds


class CorruptBlobError(ValueError):
    """A cached blob did not match its digest while being published (it has been removed)."""


@dataclass(frozen=True)
class Publication:
    """Where a build's files were published.

    Attributes:
        link: The public path: ``<recipe>/<variant>``, or ``<recipe>/<variant>.failed``.
        directory: The directory the link points at (under ``.builds/``).
        report: The content of its ``report.json``.
        summary: The summary lines (also in ``summary.txt``).
    """

    link: Path
    directory: Path
    report: dict[str, Any]
    summary: tuple[str, ...]


@dataclass(frozen=True)
class _File:
    """One file to publish: from the cache (``blob``) or text written by a failed stage."""

    rel: str
    digest: str
    size: int
    stage: str
    blob: OutputFile | None = None
    text: str | None = None

    def record(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": self.size, "stage": self.stage}


def publish_build(
    store: CacheStore,
    request: BuildRequest,
    result: BuildResult,
    recipe_dir: Path,
    variant: str,
    *,
    overrides: Sequence[str] = (),
    local: Workspace | None = None,
) -> Publication:
    """Publish ``result`` under ``recipe_dir`` (see the module docstring for the layout).

    Args:
        store: The cache the files come from.
        request: The build request (for the report).
        result: The runner's result; a failed result is published as ``<variant>.failed``.
        recipe_dir: ``<outputs>/<recipe name>``.
        variant: The variant folder name (see ``session.variant_dir``).
        overrides: The command-line overrides, recorded in full in the report.
        local: The build's checkouts: a large file the build already copied out of the cache
            (verified, unchanged since) is moved into the publication rather than copied again.

    Raises:
        CorruptBlobError: A cached blob was corrupt (removed; rebuilding the stage heals it).
    """
    link = recipe_dir / (variant if result.ok else variant + FAILED_SUFFIX)
    files = _files_to_publish(store, request.stages, result, link)
    index = {f.rel: f.record() for f in files}
    report = _fix_paths(
        build_report(request, result, store, link, index, overrides=overrides), store, link
    )
    check_text = artifact_text(store, request.stages, result, "check_summary")
    check_lines = _replace_scratch_paths(check_text, store, link).splitlines() if check_text else []
    summary = render_summary(report, check_lines)
    current = _current_directory(link)
    if result.ok and current is not None and _matches(current, files, store):
        _write_report_files(current, report, summary)
        log.info("outputs unchanged: %s", link)
        directory = current
    else:
        directory = _publish_new(store, link, files, report, summary, local)
    if result.ok:  # a good build makes an earlier failure of this variant outdated
        remove_publication(recipe_dir / (variant + FAILED_SUFFIX))
    remove_stale_builds(recipe_dir)
    return Publication(link, directory, report, tuple(summary))


def _files_to_publish(
    store: CacheStore, stages: Sequence[Stage], result: BuildResult, link: Path
) -> list[_File]:
    """The published files of every successful stage, plus those the failed stage wrote."""
    files: list[_File] = []
    for stage in stages:
        entry = result.entries.get(stage.name)
        if entry is not None:
            files += [
                _File(f.path, f.digest, f.size, stage.name, blob=f)
                for f in entry.outputs
                if _published(stage, f.path)
            ]
        elif result.error is not None and result.error.stage == stage.name:
            for rel, text in sorted(result.failed_files.items()):
                if _published(stage, rel):
                    fixed = _replace_scratch_paths(text, store, link)
                    size = len(fixed.encode("utf-8"))
                    files.append(_File(rel, sha256_text(fixed), size, stage.name, text=fixed))
    return files


def _published(stage: Stage, rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pattern) for pattern in stage.publish)


def _current_directory(link: Path) -> Path | None:
    """The publication ``link`` points at, or None (no link, or a dangling one)."""
    if not link.is_symlink():
        return None
    target = link.resolve()
    return target if target.is_dir() else None


def _matches(directory: Path, files: Sequence[_File], store: CacheStore) -> bool:
    """Whether ``directory`` already holds exactly ``files`` (digests via the fast path)."""
    previous = read_report(directory) or {}
    if sorted(previous.get("files", {})) != sorted(f.rel for f in files):
        return False
    for f in files:
        path = directory / f.rel
        try:
            if not path.is_file() or store.index.digest(path) != f.digest:
                return False
        except OSError:
            return False
    return True


def _publish_new(
    store: CacheStore,
    link: Path,
    files: Sequence[_File],
    report: Mapping[str, Any],
    summary: Sequence[str],
    local: Workspace | None,
) -> Path:
    """Write a complete publication under ``.builds/``, then swap ``link`` to it."""
    builds = link.parent / BUILDS
    builds.mkdir(parents=True, exist_ok=True)
    name = f"{link.name}.{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"
    directory = builds / name
    lock = FileLock(str(builds / (name + _LOCK_SUFFIX)))
    try:
        with lock:
            try:
                directory.mkdir()
                for f in files:
                    _write_file(store, f, directory / f.rel, local)
                _write_report_files(directory, report, summary)
                previous = _current_directory(link)
                _swap_link(link, directory)
            except BaseException:  # Ctrl-C included: leave no half-written publication
                shutil.rmtree(directory, ignore_errors=True)
                raise
    finally:
        Path(lock.lock_file).unlink(missing_ok=True)
    if previous is not None and previous != directory and previous.parent == builds:
        shutil.rmtree(previous, ignore_errors=True)
    store.save_index()
    log.info("published %s", link)
    return directory


def _write_file(store: CacheStore, f: _File, target: Path, local: Workspace | None) -> None:
    """Write one published file: a cached blob's bytes, or a failed stage's text.

    A blob's bytes are the build's own verified copy when it holds one (moved here), else a
    clone of the blob (reflink, else a copy), verified by digest.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if f.blob is None:
        atomic_write_bytes(target, (f.text or "").encode("utf-8"))
        return
    if local is not None and local.hand_over(f.digest, target):
        store.index.remember(target, f.digest)
        return
    blob = store.blob_path(f.digest)
    clone_or_copy(blob, target)
    os.chmod(target, 0o644)
    if sha256_file(target) != f.digest:
        log.warning("cached blob of %s does not match its digest; removing it", f.rel)
        if not store.read_only:
            blob.unlink(missing_ok=True)
        raise CorruptBlobError(f"cached blob of {f.rel} is corrupt")
    store.index.remember(target, f.digest)


def _swap_link(link: Path, directory: Path) -> None:
    """Point ``link`` at ``directory`` with one ``os.replace`` (a relative symlink)."""
    if link.exists() and not link.is_symlink():
        # A folder published by an older hyperexport: move it aside (one rename), so the
        # link can take its place; the cleanup below removes it.
        aside = link.parent / BUILDS / f"{link.name}.legacy-{secrets.token_hex(4)}"
        log.info("moving %s (an older layout) to %s", link, aside)
        os.rename(link, aside)
    tmp = link.parent / f".{link.name}.link-{secrets.token_hex(4)}"
    os.symlink(os.path.relpath(directory, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_publication(link: Path) -> None:
    """Remove a published variant: the link, the directory it names, and ``.builds`` if empty.

    A real directory (the layout of older versions) is removed as a whole.
    """
    if link.is_symlink():
        target = link.resolve()
        link.unlink(missing_ok=True)
        if target.parent.name == BUILDS:
            shutil.rmtree(target, ignore_errors=True)
    elif link.is_dir():
        shutil.rmtree(link)
    builds = link.parent / BUILDS
    if builds.is_dir() and not any(builds.iterdir()):
        builds.rmdir()


def remove_stale_builds(recipe_dir: Path) -> list[Path]:
    """Remove publications no link points at whose lock is free (left by killed builds).

    A publication being written holds its lock; one that is linked is kept. The link check is
    repeated while holding the lock, so a build that swaps its link just before is never hurt.

    Returns:
        The directories removed.
    """
    builds = recipe_dir / BUILDS
    if not builds.is_dir():
        return []
    removed = []
    for path in sorted(builds.iterdir()):
        if path.name.endswith(_LOCK_SUFFIX) and not Path(str(path)[: -len(_LOCK_SUFFIX)]).exists():
            _remove_free_lock(path)  # its publication is gone
            continue
        if path.name.endswith(_LOCK_SUFFIX) or not path.is_dir() or path in _linked(recipe_dir):
            continue
        lock = FileLock(str(path) + _LOCK_SUFFIX, timeout=0)
        try:
            with lock:
                if path not in _linked(recipe_dir):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
        except Timeout:
            continue  # a live build is writing it
        Path(lock.lock_file).unlink(missing_ok=True)
    for path in recipe_dir.glob(".*.link-*"):  # temp links of killed builds
        if path.is_symlink():
            path.unlink(missing_ok=True)
    for path in removed:
        log.info("removed %s (left by an interrupted build)", path)
    return removed


def _remove_free_lock(path: Path) -> None:
    """Remove a lock file whose publication is gone, if it is free and old.

    A build creates its lock just before its directory: a young lock without a directory may
    belong to a build that is starting, so only locks older than a bound are removed.
    """
    try:
        if time.time() - path.stat().st_mtime < _ORPHAN_LOCK_AGE:
            return
    except FileNotFoundError:
        return
    lock = FileLock(str(path), timeout=0)
    try:
        with lock:
            pass
    except Timeout:
        return  # a build has just taken it and is about to create its publication
    path.unlink(missing_ok=True)


def _linked(recipe_dir: Path) -> set[Path]:
    return {p.resolve() for p in recipe_dir.iterdir() if p.is_symlink()}


_SCRATCH_NAME = r"[^/\\\s'\"]+"


def _replace_scratch_paths(text: str, store: CacheStore, link: Path) -> str:
    """Paths into a build's scratch checkouts become the published path of the same file."""
    pattern = re.escape(str(store.root / "tmp")) + rf"/{_SCRATCH_NAME}/{_SCRATCH_NAME}/"
    return re.sub(pattern, lambda _: str(link) + "/", text)


def _fix_paths(value: Any, store: CacheStore, link: Path) -> Any:
    """:func:`_replace_scratch_paths` in every string of a report."""
    if isinstance(value, str):
        return _replace_scratch_paths(value, store, link)
    if isinstance(value, Mapping):
        return {k: _fix_paths(v, store, link) for k, v in value.items()}
    if isinstance(value, list):
        return [_fix_paths(v, store, link) for v in value]
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
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """The content of ``report.json``; artifact paths are under ``out_dir`` (the public link)."""
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
            "file": request.recipe_file,
            "config": dict(request.recipe),
        },
        "overrides": list(overrides),
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
        # The model's inputs and outputs with traced shapes and dtypes (report.html shows them).
        "io": model_io(json.loads(capture_text)) if capture_text else None,
    }


def _write_report_files(directory: Path, report: Mapping[str, Any], summary: Sequence[str]) -> None:
    """Write ``summary.txt``, ``report.json`` then ``report.html`` (each atomically)."""
    atomic_write_bytes(directory / SUMMARY, ("\n".join(summary) + "\n").encode("utf-8"))
    atomic_write_json(directory / REPORT, report)
    write_report_html(directory, report)

"""Publish a build's artifacts as one directory that replaces the previous one atomically.

Layout under ``<outputs>/<recipe>/`` (documented in outputs/README.md)::

    <variant>                   symlink -> .builds/<variant>.<id>: the last good build
    <variant>.failed            symlink -> .builds/<variant>.failed.<id>: the last failed build,
                                removed by the next good build
    .builds/<variant>.<id>/     one complete publication: model, external data, manifest,
                                check.json, check.txt, report.json, summary.txt
    .builds/<variant>.<id>.lock held (filelock) while that publication is being written

A publication is written in full under ``.builds/`` (files cloned from the cache with
:func:`~hyperexport.engine.files.clone_or_copy_hashed` and verified by the digest of the bytes
copied, or, for a large file the build already holds verified, that copy moved in:
``workspace.py``), then the link is swapped with one ``os.replace``: a reader that resolves the
link sees the previous build or the new one, never a mix, also when the build is killed at any
point. The previous directory is removed after the swap; directories left by killed builds (no
link points at them and their lock is free) are removed by the next publication in the same recipe folder (``cleanup.py``). The
report it writes beside the artifacts is ``report.py``'s; the layout's names are ``layout.py``'s.

A failed build never touches ``<variant>``: the last good artifact stays, and what the failed
build made (the failing model, its check and report) goes to ``<variant>.failed``, with the
scratch paths in its messages replaced by the published paths.

A no-op rebuild whose artifacts are already published (same digests) does not copy them again:
only ``report.json``, ``report.html`` and ``summary.txt`` of the current publication are replaced
(each atomically); they describe the same files.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import MODEL_FILE, QUANTIZED_MODEL_FILE
from hyperexport.base.errors import ForeignPathError
from hyperexport.engine.entries import OutputFile
from hyperexport.engine.files import clone_or_copy_hashed
from hyperexport.engine.hashing import sha256_text
from hyperexport.engine.runner import BuildRequest, BuildResult
from hyperexport.engine.stage import Stage
from hyperexport.engine.store import CacheStore
from hyperexport.engine.store import CorruptBlobError as StoreCorruptBlobError
from hyperexport.engine.workspace import Workspace
from hyperexport.product.builds.cleanup import remove_publication, remove_stale_builds
from hyperexport.product.builds.layout import BUILDS, FAILED_SUFFIX, LOCK_SUFFIX
from hyperexport.product.builds.recipe_source import (
    ForeignRecipeError,
    published_source,
    recipe_source,
)
from hyperexport.product.builds.report import (
    artifact_text,
    build_report,
    fix_paths,
    read_report,
    replace_scratch_paths,
    write_report_files,
)
from hyperexport.product.builds.summary import render_summary

log = logging.getLogger(__name__)


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
        ForeignRecipeError: ``recipe_dir`` holds publications of another recipe source.
    """
    link = recipe_dir / (variant if result.ok else variant + FAILED_SUFFIX)
    check_same_source(recipe_dir, request.source)  # again: one may have appeared meanwhile
    files = _files_to_publish(store, request.stages, result, link)
    index = {f.rel: f.record() for f in files}
    report = fix_paths(
        build_report(request, result, store, link, index, overrides=overrides), store, link
    )
    check_text = artifact_text(store, request.stages, result, "check_summary")
    check_lines = replace_scratch_paths(check_text, store, link).splitlines() if check_text else []
    summary = render_summary(report, check_lines)
    current = _current_directory(link)
    if result.ok and current is not None and _matches(current, files, store):
        write_report_files(current, report, summary)
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
    """The published files of every successful stage, plus those the failed stage wrote.

    A later stage's file replaces an earlier one's of the same name: the quantize stage's
    ``genai_config.json`` (naming the quantized model) replaces the trace's.
    """
    files: dict[str, _File] = {}
    for stage in stages:
        entry = result.entries.get(stage.name)
        if entry is not None:
            for f in entry.outputs:
                if _published(stage, f.path):
                    files[f.path] = _File(f.path, f.digest, f.size, stage.name, blob=f)
        elif result.error is not None and result.error.stage == stage.name:
            for rel, text in sorted(result.failed_files.items()):
                if _published(stage, rel):
                    fixed = replace_scratch_paths(text, store, link)
                    size = len(fixed.encode("utf-8"))
                    files[rel] = _File(rel, sha256_text(fixed), size, stage.name, text=fixed)
    return list(files.values())


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
    lock = FileLock(str(builds / (name + LOCK_SUFFIX)))
    try:
        with lock:
            try:
                directory.mkdir()
                previous = _current_directory(link)
                others = _other_publications(builds, directory, previous)
                copied = [f for f in files if _write_file(store, f, directory / f.rel, local)]
                _note_shared_copies(store, copied, others)
                write_report_files(directory, report, summary)
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


def _other_publications(builds: Path, directory: Path, previous: Path | None) -> list[Path]:
    """The recipe's publications that stay beside ``directory`` (not the one it replaces)."""
    return sorted(d for d in builds.iterdir() if d.is_dir() and d != directory and d != previous)


def _write_file(store: CacheStore, f: _File, target: Path, local: Workspace | None) -> bool:
    """Write one published file: a cached blob's bytes, or a failed stage's text.

    A blob's bytes are the build's own verified copy when it holds one (moved here), else a
    clone of the blob (reflink, else a copy), verified by digest. Returns whether the bytes
    were copied from the cache (neither moved nor reflinked): they then take space again.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    if f.blob is None:
        atomic_write_bytes(target, (f.text or "").encode("utf-8"))
        return False
    if local is not None and local.hand_over(f.digest, target):
        store.index.remember(target, f.digest)
        return False
    blob = store.blob_path(f.digest)
    if not blob.is_file() and store.sources_of(f.digest) is not None:
        try:  # recorded by reference: assembled from its sources, verified
            store.copy_blob(f.blob, target)
        except StoreCorruptBlobError as e:
            raise CorruptBlobError(f"cached blob of {f.rel} is corrupt") from e
        store.index.remember(target, f.digest)
        return True
    how, digest = clone_or_copy_hashed(blob, target)
    os.chmod(target, 0o644)
    if digest != f.digest:
        log.warning("cached blob of %s does not match its digest; removing it", f.rel)
        if not store.read_only:
            blob.unlink(missing_ok=True)
        raise CorruptBlobError(f"cached blob of {f.rel} is corrupt")
    store.index.remember(target, f.digest)
    return how == "copy"


def _note_shared_copies(store: CacheStore, copied: Sequence[_File], others: Sequence[Path]) -> None:
    """One INFO line when model files just copied are also held by another publication.

    A variant that differs from another only in ``check.*`` publishes the same model file, byte
    for byte: a real model, which every tool opens as it opens the other. Without reflinks its
    bytes are on disk once more; onnx refuses hard- or symbolically-linked external data, so a
    copy is the only way to keep ``<variant>/model.onnx`` a model (``outputs/README.md``,
    "Variants that share a model"). That is expected, not a fault: said once per publication.
    """
    models = [f for f in copied if f.rel.startswith((MODEL_FILE, QUANTIZED_MODEL_FILE))]
    for other in others:
        shared = [f for f in models if _holds(store, other, f)]
        if shared:
            log.info(
                "the model files of this variant (%s, %.1f MB) are those of %s, copied "
                "(no reflinks here)",
                ", ".join(f.rel for f in shared),
                sum(f.size for f in shared) / 1e6,
                other,
            )
            return


def _holds(store: CacheStore, directory: Path, f: _File) -> bool:
    """Whether ``directory`` holds ``f`` (same size, same digest via the index's fast path)."""
    path = directory / f.rel
    try:
        return path.stat().st_size == f.size and store.index.digest(path) == f.digest
    except OSError:
        return False


def check_same_source(recipe_dir: Path, recipe_file: str) -> None:
    """Refuse to publish into ``recipe_dir`` when a publication there (a ``<variant>`` or
    ``<variant>.failed`` link) was made from another recipe source than ``recipe_file``
    (``recipe_source.py``).

    Raises:
        ForeignRecipeError: naming the recipe file of that publication and ``recipe_file``.
    """
    if not recipe_dir.is_dir():
        return
    mine = recipe_source(recipe_file)
    for link in sorted(recipe_dir.iterdir()):
        if link.name.startswith(".") or not link.is_symlink():
            continue
        report = read_report(link) if os.path.isdir(link) else None
        found = published_source(report) if report is not None else None
        if found is not None and found[0] != mine:
            raise ForeignRecipeError(recipe_dir, found[1], recipe_file)


def check_not_foreign(link: Path) -> None:
    """Refuse a path at ``link`` that hyperexport did not create (anything but a symlink).

    Raises:
        ForeignPathError: ``link`` is a real file or directory (a user's data, or a folder of
            an older hyperexport's layout): it is never moved, overwritten or deleted.
    """
    if not link.is_symlink() and os.path.lexists(link):
        raise ForeignPathError(link)


def _swap_link(link: Path, directory: Path) -> None:
    """Point ``link`` at ``directory`` with one ``os.replace`` (a relative symlink).

    Raises:
        ForeignPathError: ``link`` is a path hyperexport did not create (checked again here:
            it may have appeared while the build ran); ``os.replace`` would overwrite a file.
    """
    check_not_foreign(link)
    tmp = link.parent / f".{link.name}.link-{secrets.token_hex(4)}"
    os.symlink(os.path.relpath(directory, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

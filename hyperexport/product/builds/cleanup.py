"""Removing publications: a variant on request, and the folders killed builds left behind (no
link names them and their lock is free).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from filelock import FileLock, Timeout

from hyperexport.product.builds.layout import BUILDS, LOCK_SUFFIX

log = logging.getLogger(__name__)

#: A lock file without its publication is removed only when older than this (seconds).
_ORPHAN_LOCK_AGE = 600.0


def is_publication_link(link: Path) -> bool:
    """Whether ``link`` is a link hyperexport made: a symlink into its folder's ``.builds/``
    (what it names may be gone)."""
    if not link.is_symlink():
        return False
    target = Path(os.path.normpath(link.parent / os.readlink(link)))
    return target.parent == link.parent / BUILDS


def remove_publication(link: Path) -> bool:
    """Remove a published variant: the link, the directory it names, and ``.builds`` if empty.

    Only what hyperexport created is removed: anything at ``link`` but a link into
    ``.builds/`` (a real file or directory, a link of the user's) is left untouched, with a
    WARNING.

    Returns:
        Whether ``link`` was removed (False also when there was nothing there).
    """
    if is_publication_link(link):
        target = Path(os.path.normpath(link.parent / os.readlink(link)))
        link.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        removed = True
    else:
        if os.path.lexists(link):
            log.warning(
                "%s was not created by hyperexport (not a link into %s); left untouched",
                link,
                BUILDS,
            )
        removed = False
    builds = link.parent / BUILDS
    if builds.is_dir() and not any(builds.iterdir()):
        builds.rmdir()
    return removed


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
        if path.name.endswith(LOCK_SUFFIX) and not Path(str(path)[: -len(LOCK_SUFFIX)]).exists():
            _remove_free_lock(path)  # its publication is gone
            continue
        if path.name.endswith(LOCK_SUFFIX) or not path.is_dir() or path in _linked(recipe_dir):
            continue
        lock = FileLock(str(path) + LOCK_SUFFIX, timeout=0)
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

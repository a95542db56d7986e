"""Locks of the cache: one computation per stage key, and scratch folders tied to a live build.

Every lock is a ``filelock`` lock file under ``<cache>/locks/``; the operating system releases
it when its holder dies (``flock``), so a killed build never leaves a lock to delete by hand::

    locks/keys/<aa>/<key>.lock     held while one build computes the entry of <key>
    locks/scratch/<name>.lock      held for the life of the scratch folder tmp/<name>

**Single flight.** :func:`single_flight` holds a key's lock: a build that misses a key takes it,
looks the key up again (another build may have committed it meanwhile), and computes it only
if it is still missing. Others wait on the lock, then hit.

**Scratch liveness** (shared with the collector, ``collector.py``). A build takes the lock of a scratch
folder *before* it creates the folder and releases it *after* removing it, so a folder whose
lock can be taken belongs to a dead build (:func:`scratch_is_live`). PIDs are never used: they
mean nothing on storage shared between machines. Where the filesystem refuses locks, a folder
counts as dead once it is older than :data:`SCRATCH_MAX_AGE`.

**Lock files stay.** Key lock files are empty and are never deleted while builds may run: a
build waiting on a lock file that is unlinked and re-created would hold a different lock than
the next build. Scratch lock files are removed with their folder (their names are unique).

**Shared filesystems.** On NFS, Linux emulates ``flock`` with NFS byte-range locks: they work
across clients when the server's lock manager does (NFSv4, or NFSv3 with lockd; never with the
``nolock`` mount option), and a client cut off from the server may lose its lock. Locks are an
optimisation of work, not of correctness: every write of the cache is atomic and
content-addressed, so a lock that fails only lets two builds compute the same entry.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger(__name__)

LOCKS_DIR = "locks"
SCRATCH_DIR = "tmp"
#: A scratch folder whose lock cannot be tested counts as dead when older than this (seconds).
SCRATCH_MAX_AGE = 24 * 3600.0

_warned: set[str] = set()


def _lock(path: Path) -> FileLock:
    from filelock import FileLock  # imported on first use: a no-op build takes no lock

    path.parent.mkdir(parents=True, exist_ok=True)
    # No soft (marker-file) fallback: a marker outlives a killed holder, a flock does not.
    return FileLock(path, fallback_to_soft=False)


def _warn_once(root: Path, error: OSError) -> None:
    if str(root) not in _warned:
        _warned.add(str(root))
        log.warning(
            "file locks do not work under %s (%s): concurrent builds may compute the same "
            "stage twice, and dead builds' scratch folders are removed after %d h",
            root,
            error,
            SCRATCH_MAX_AGE // 3600,
        )


def key_lock_path(root: Path, key: str) -> Path:
    """The lock file of stage key ``key`` in the cache at ``root``."""
    return root / LOCKS_DIR / "keys" / key[:2] / f"{key}.lock"


def scratch_lock_path(root: Path, scratch: Path) -> Path:
    """The lock file of scratch folder ``scratch`` (a child of ``<root>/tmp``)."""
    return root / LOCKS_DIR / "scratch" / f"{scratch.name}.lock"


@contextlib.contextmanager
def single_flight(root: Path, key: str, what: str) -> Iterator[None]:
    """Hold the lock of ``key`` for the block: waits while another build holds it.

    Args:
        root: Cache root.
        key: The stage key.
        what: Names the work in the log line written while waiting (``"stage export"``).
    """
    lock = _lock(key_lock_path(root, key))
    held = True
    try:
        try:
            lock.acquire(timeout=0)
        except _timeout():
            log.info("%s: another build is computing it; waiting for its result", what)
            lock.acquire()
    except OSError as e:
        _warn_once(root, e)
        held = False
    try:
        yield
    finally:
        if held:
            lock.release()


@contextlib.contextmanager
def scratch_dir(root: Path, prefix: str) -> Iterator[Path]:
    """A fresh folder ``<root>/tmp/<prefix><random>``, locked while this block runs, then removed."""
    path = root / SCRATCH_DIR / f"{prefix}{secrets.token_hex(6)}"
    lock_path = scratch_lock_path(root, path)
    lock = _lock(lock_path)
    locked = True
    try:
        lock.acquire(timeout=0)  # a fresh random name: nobody else holds it
    except OSError as e:
        _warn_once(root, e)
        locked = False
    try:
        path.mkdir(parents=True)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if locked:
            lock.release()
            lock_path.unlink(missing_ok=True)


def scratch_is_live(root: Path, scratch: Path, max_age: float = SCRATCH_MAX_AGE) -> bool:
    """Whether scratch folder ``scratch`` may belong to a running build.

    True while its lock is held; where locks do not work, while it is younger than ``max_age``.
    """
    lock = _lock(scratch_lock_path(root, scratch))
    try:
        lock.acquire(timeout=0)
    except _timeout():
        return True
    except OSError as e:
        _warn_once(root, e)
        return _age(scratch) < max_age
    lock.release()
    return False


def remove_dead_scratch(root: Path, max_age: float = SCRATCH_MAX_AGE) -> list[Path]:
    """Remove the scratch folders of dead builds (see :func:`scratch_is_live`); return them."""
    base = root / SCRATCH_DIR
    if not base.is_dir() or not any(base.iterdir()):
        return []
    removed = []
    for path in sorted(base.iterdir()):
        lock_path = scratch_lock_path(root, path)
        lock = _lock(lock_path)
        try:
            lock.acquire(timeout=0)
        except _timeout():
            continue
        except OSError as e:
            _warn_once(root, e)
            if _age(path) >= max_age:
                _remove(path)
                removed.append(path)
            continue
        try:
            _remove(path)
            removed.append(path)
        finally:
            lock.release()
            lock_path.unlink(missing_ok=True)
    if removed:
        log.info("removed %d scratch folder(s) of dead builds under %s", len(removed), base)
    return removed


def _timeout() -> type[Exception]:
    from filelock import Timeout

    return Timeout


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except FileNotFoundError:
        return float("inf")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

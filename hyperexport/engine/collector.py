"""The collector: least-recently-used eviction that never leaves an entry without its blobs.

Order of removal, safe while builds run on the same cache:

1. Entries are chosen least recently used first (an entry's last use is its file's mtime, set
   when it is written and on every hit): all that were not used for ``older_than``, then more
   until the cache fits ``max_size``. Entries used within the grace period are never evicted:
   a running build may still copy their blobs out.
2. Only then are blobs removed, and only those that no entry left on disk names (the entries
   are listed again after step 1, so entries committed meanwhile count) and that were not
   written or reused within the grace period: a running build writes its blobs before its
   entry, and refreshes the time of a blob it reuses
   (:meth:`~.store.CacheStore.commit`).
3. Dependency records (``<cache>/deps/``, :mod:`.discovered`) go once no
   entry left on disk is stored under a key they resolve to, unless written within the grace
   period (a build writes its record just before its entry): without the entry, a record only
   makes a build look at sets that hit nothing. A record of a newer format stays.
4. Temporary files of killed writes older than the grace period go too, and so do the scratch
   folders of dead builds, by the build's own rule
   (:func:`~.process_locks.remove_dead_scratch`: a folder whose lock is free).

No lock is needed for this: every file is *retired* by renaming it out of place first, then its
time is read again; if a build used it meanwhile, it is put back. A build's hit
(:meth:`~.store.CacheStore.mark_used`) or reuse of a blob either happens
before the rename (the new time is seen, the file stays) or fails to find the file (the hit
becomes a miss; the blob is written again), so no entry is ever left naming a missing blob.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import process_locks
from .discovered import recorded_keys
from .inventory import (
    TEMP_SUFFIX,
    EntryInfo,
    disk_usage,
    scan,
    stale_temp_files,
)
from .store import CacheStore

log = logging.getLogger(__name__)

DEFAULT_GRACE = 3600.0


@dataclass(frozen=True)
class GcOptions:
    """What the collector may remove.

    Attributes:
        max_size: Evict until the whole cache directory is at most this many bytes.
        older_than: Evict entries not used for this many seconds.
        grace: Never evict an entry used, nor delete a blob written, within this many seconds.
        dry_run: Only report what would be removed.
    """

    max_size: int | None = None
    older_than: float | None = None
    grace: float = DEFAULT_GRACE
    dry_run: bool = False


@dataclass
class GcResult:
    """What the collector removed (or, in a dry run, would remove).

    Attributes:
        size_before: Bytes in the cache directory before.
        size_after: Bytes after (in a dry run: the projection).
        evicted: Evicted entries, least recently used first.
        kept_recent: Entries that qualified for eviction but were used within the grace period.
        unreadable: Entry files that were not valid entries (removed, as a lookup would).
        blobs: Number of blobs removed.
        blob_bytes: Their bytes.
        records: Number of dependency records removed.
        record_bytes: Their bytes.
        temp_files: Stale temporary files removed.
        scratch: Scratch folders of dead builds removed.
        scratch_bytes: Their bytes.
    """

    size_before: int
    size_after: int = 0
    evicted: list[EntryInfo] = field(default_factory=list)
    kept_recent: int = 0
    unreadable: list[str] = field(default_factory=list)
    blobs: int = 0
    blob_bytes: int = 0
    records: int = 0
    record_bytes: int = 0
    temp_files: int = 0
    scratch: int = 0
    scratch_bytes: int = 0


@dataclass(frozen=True)
class _Blob:
    path: Path
    size: int
    mtime: float


@dataclass(frozen=True)
class _Record:
    """A dependency record: the full keys it resolves to (None: a newer format, kept)."""

    path: Path
    size: int
    mtime: float
    keys: frozenset[str] | None


def _records(store: CacheStore) -> list[_Record]:
    found = []
    for path in sorted((store.root / "deps").glob("*/*.json")):
        if path.name.startswith("."):
            continue
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        found.append(_Record(path, st.st_size, st.st_mtime, recorded_keys(path)))
    return found


def _unreferenced(records: Sequence[_Record], keys: set[str], cutoff: float) -> list[_Record]:
    """The records that resolve to none of ``keys`` and were not written after ``cutoff``."""
    return [r for r in records if r.keys is not None and not (r.keys & keys) and r.mtime <= cutoff]


def _blobs(store: CacheStore) -> dict[str, _Blob]:
    """Every blob, and every record of one by reference (which takes only its own size)."""
    found = {}
    for digest, path in [*store.ref_paths(), *store.blob_paths()]:
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        found[digest] = _Blob(path, st.st_size, st.st_mtime)
    return found


def plan(
    entries: Sequence[EntryInfo],
    blobs: dict[str, _Blob],
    projected: int,
    options: GcOptions,
    now: float,
    records: Sequence[_Record] = (),
) -> tuple[list[EntryInfo], int]:
    """Choose entries to evict, least recently used first.

    Args:
        entries: Readable entries, least recently used first.
        blobs: The blobs on disk.
        projected: Cache bytes once garbage (unreferenced old blobs and dependency records,
            temp files) is gone.
        options: Bounds and grace period.
        now: The current time (epoch seconds).
        records: The dependency records on disk (an evicted entry may free its record).

    Returns:
        ``(entries to evict, number kept because they were used within the grace period)``.
    """
    refs = Counter(d for e in entries for d in set(e.entry.digests().values()))
    on_disk = {e.key for e in entries}
    live = {r.path: set(r.keys & on_disk) for r in records if r.keys}
    record_of = {k: r for r in records if r.keys for k in r.keys if k in on_disk}
    evict: list[EntryInfo] = []
    kept_recent = 0
    for info in entries:
        idle = now - info.last_used
        stale = options.older_than is not None and idle > options.older_than
        too_big = options.max_size is not None and projected > options.max_size
        if not (stale or too_big):
            continue
        if idle < options.grace:
            kept_recent += 1
            continue
        evict.append(info)
        projected -= _file_size(info.path)
        for digest in set(info.entry.digests().values()):
            refs[digest] -= 1
            blob = blobs.get(digest)
            if refs[digest] == 0 and blob is not None and now - blob.mtime >= options.grace:
                projected -= blob.size
        record = record_of.get(info.key)
        if record is not None and info.key in live[record.path]:
            live[record.path].discard(info.key)
            if not live[record.path] and now - record.mtime >= options.grace:
                projected -= record.size
    return evict, kept_recent


def collect(store: CacheStore, options: GcOptions, now: float | None = None) -> GcResult:
    """Evict entries and remove unreferenced blobs and stale temporary files (see module doc)."""
    now = time.time() if now is None else now
    inventory = scan(store)
    blobs = _blobs(store)
    records = _records(store)
    result = GcResult(size_before=disk_usage(store.root))
    _collect_scratch(store, options, result)
    cutoff = now - options.grace
    temps = stale_temp_files(store, cutoff)
    referenced = {d for e in inventory.entries for d in e.entry.digests().values()}
    for digest in list(referenced):  # and the blobs their records read (sourced.py)
        record = store.sources_of(digest)
        referenced |= record.blobs() if record is not None else set()
    orphans = [b for d, b in blobs.items() if d not in referenced and b.mtime <= cutoff]
    orphan_records = _unreferenced(records, {e.key for e in inventory.entries}, cutoff)
    garbage = (
        sum(b.size for b in orphans)
        + sum(r.size for r in orphan_records)
        + sum(_file_size(p) for p in temps)
        + sum(_file_size(p) for _k, _r, p in inventory.unreadable)
        + result.scratch_bytes
    )
    evict, result.kept_recent = plan(
        inventory.entries, blobs, result.size_before - garbage, options, now, records
    )
    result.unreadable = [key for key, _reason, _path in inventory.unreadable]
    if options.dry_run:
        result.evicted = evict
        gone = {e.key for e in evict}
        kept = {
            d for e in inventory.entries if e.key not in gone for d in e.entry.digests().values()
        }
        dropped = [b for d, b in blobs.items() if d not in kept and b.mtime <= cutoff]
        result.blobs, result.blob_bytes = len(dropped), sum(b.size for b in dropped)
        if not inventory.unreadable:
            left = {e.key for e in inventory.entries if e.key not in gone}
            loose = _unreferenced(records, left, cutoff)
            result.records, result.record_bytes = len(loose), sum(r.size for r in loose)
        result.temp_files = len(temps)
        freed = sum(_file_size(e.path) for e in evict) + result.blob_bytes + result.record_bytes
        freed += sum(_file_size(p) for p in temps)
        freed += sum(_file_size(p) for _k, _r, p in inventory.unreadable)
        freed += result.scratch_bytes
        result.size_after = result.size_before - freed
        return result
    for key, reason, path in inventory.unreadable:
        log.warning("removing unreadable cache entry %s (%s)", key[:12], reason)
        path.unlink(missing_ok=True)
    for info in evict:
        if _evict(info, cutoff):
            result.evicted.append(info)
        else:
            result.kept_recent += 1
    _remove_unreferenced_blobs(store, cutoff, result)
    _remove_unreferenced_records(store, cutoff, result)
    for path in temps:
        if retire(path, cutoff) is not None:
            result.temp_files += 1
    result.size_after = disk_usage(store.root)
    return result


def _collect_scratch(store: CacheStore, options: GcOptions, result: GcResult) -> None:
    """Remove (in a dry run: count) the scratch folders of dead builds."""
    base = store.root / process_locks.SCRATCH_DIR
    folders = sorted(base.iterdir()) if base.is_dir() else []
    if options.dry_run:
        dead = [p for p in folders if not process_locks.scratch_is_live(store.root, p)]
        result.scratch_bytes = sum(disk_usage(p) for p in dead)
    else:
        sizes = {p: disk_usage(p) for p in folders}
        dead = process_locks.remove_dead_scratch(store.root)
        result.scratch_bytes = sum(sizes.get(p, 0) for p in dead)
    result.scratch = len(dead)


def _evict(info: EntryInfo, cutoff: float) -> bool:
    """Remove one entry unless a build used it since it was chosen."""
    return retire(info.path, cutoff) is not None


def retire(path: Path, cutoff: float) -> int | None:
    """Remove ``path`` unless it was modified after ``cutoff`` (epoch seconds).

    The file is first renamed out of place (``.<name>.gc.tmp``, which a later gc removes if
    this one is killed), then its time is read again: a file touched meanwhile is put back.

    Returns:
        The bytes removed, or None if the file stayed (or was already gone).
    """
    trash = path.with_name(f".{path.name}.gc{TEMP_SUFFIX}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return None
    st = trash.stat()
    if st.st_mtime > cutoff:
        os.replace(trash, path)
        return None
    trash.unlink()
    return st.st_size


def _remove_unreferenced_blobs(store: CacheStore, cutoff: float, result: GcResult) -> None:
    """Delete blobs that no entry on disk names, unless written or reused after ``cutoff``."""
    inventory = scan(store)  # after the evictions: entries committed meanwhile count
    referenced = {d for e in inventory.entries for d in e.entry.digests().values()}
    for digest in list(referenced):  # and the blobs their records read (sourced.py)
        record = store.sources_of(digest)
        referenced |= record.blobs() if record is not None else set()
    if inventory.unreadable:
        # Entries that cannot be read may still name blobs (e.g. a newer format): keep all.
        log.warning(
            "%d unreadable cache entries appeared; no blob removed", len(inventory.unreadable)
        )
        return
    for digest, path in [*store.blob_paths(), *store.ref_paths()]:
        if digest in referenced or _file_mtime(path) > cutoff:
            continue
        size = retire(path, cutoff)
        if size is not None:
            result.blobs += 1
            result.blob_bytes += size


def _remove_unreferenced_records(store: CacheStore, cutoff: float, result: GcResult) -> None:
    """Delete dependency records that resolve to no entry on disk, unless written after
    ``cutoff``: listed after the evictions, so entries committed meanwhile count."""
    inventory = scan(store)
    if inventory.unreadable:
        return  # an entry that cannot be read may be stored under a record's key: keep all
    keys = {e.key for e in inventory.entries}
    for record in _unreferenced(_records(store), keys, cutoff):
        size = retire(record.path, cutoff)
        if size is not None:
            result.records += 1
            result.record_bytes += size


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _file_mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")

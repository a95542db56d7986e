"""What a cache holds: its entries with stage, builds, size and last use, read as plain data.

An entry's builds are the build recorded in the entry when it was computed plus every build
whose latest run (``runs/<build>/<stage>.json``) used it; its last use is its file's mtime,
refreshed on every hit (:meth:`~.store.CacheStore.mark_used`).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .entries import ActionEntry
from .store import CacheStore

log = logging.getLogger(__name__)

TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class EntryInfo:
    """One action entry as an inventory lists it.

    Attributes:
        key: The stage key (full sha256).
        stage: The stage that produced it.
        builds: The builds known to have used it (sorted; empty if unknown).
        size: Bytes of its output files (blobs may be shared with other entries).
        last_used: When it was written or last hit (seconds since the epoch).
        entry: The parsed entry.
        path: Its file.
    """

    key: str
    stage: str
    builds: tuple[str, ...]
    size: int
    last_used: float
    entry: ActionEntry
    path: Path


@dataclass(frozen=True)
class Inventory:
    """Every entry of a cache, plus the entry files that could not be parsed.

    Attributes:
        entries: Readable entries, least recently used first.
        unreadable: ``(key, reason, path)`` of entry files that are not valid entries.
    """

    entries: tuple[EntryInfo, ...]
    unreadable: tuple[tuple[str, str, Path], ...]


class AmbiguousKey(LookupError):
    """A key prefix matches several entries."""


def builds_by_key(store: CacheStore) -> dict[str, set[str]]:
    """``{key: {build, ...}}`` from the run records (each build's latest key per stage)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in sorted((store.root / "runs").glob("*/*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable run record %s: %s", path, e)
            continue
        key = data.get("key") if isinstance(data, Mapping) else None
        if isinstance(key, str):
            build = data.get("build")  # a variant's folder is <build>_<variant>
            found[key].add(build if isinstance(build, str) else path.parent.name)
    return found


def scan(store: CacheStore) -> Inventory:
    """Read every entry of ``store`` (entries deleted meanwhile are skipped)."""
    runs = builds_by_key(store)
    entries: list[EntryInfo] = []
    unreadable: list[tuple[str, str, Path]] = []
    for key, path in store.entry_paths():
        try:
            entry = store.read_entry(key)
            last_used = path.stat().st_mtime
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            unreadable.append((key, f"{type(e).__name__}: {e}", path))
            continue
        builds = set(runs.get(key, ()))
        if entry.build:
            builds.add(entry.build)
        entries.append(
            EntryInfo(
                key=key,
                stage=entry.stage,
                builds=tuple(sorted(builds)),
                size=sum(f.size for f in entry.outputs),
                last_used=last_used,
                entry=entry,
                path=path,
            )
        )
    entries.sort(key=lambda e: (e.last_used, e.key))
    return Inventory(tuple(entries), tuple(unreadable))


def find(entries: Iterable[EntryInfo], prefix: str) -> EntryInfo:
    """The entry whose key starts with ``prefix``.

    Raises:
        KeyError: No entry matches.
        AmbiguousKey: Several do (the message lists how many).
    """
    matches = [e for e in entries if e.key.startswith(prefix.lower())]
    if not matches:
        raise KeyError(prefix)
    if len(matches) > 1:
        raise AmbiguousKey(f"key prefix {prefix!r} matches {len(matches)} entries")
    return matches[0]


def disk_usage(root: Path) -> int:
    """Bytes of every regular file under ``root`` (apparent sizes, as ``du -sb``)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # removed by a concurrent build meanwhile
                continue
    return total


def stale_temp_files(store: CacheStore, older_than: float) -> list[Path]:
    """Temporary files of atomic writes (``.<name>.<random>.tmp``) in blobs/, actions/, runs/,
    index/ and deps/ not modified since ``older_than`` (epoch seconds): left by killed writers."""
    found = []
    for sub in ("blobs", "actions", "runs", "index", "deps"):
        for path in sorted((store.root / sub).rglob(f".*{TEMP_SUFFIX}")):
            try:
                if path.is_file() and path.stat().st_mtime < older_than:
                    found.append(path)
            except FileNotFoundError:
                continue
    return found

"""Canonical JSON, content digests, atomic writes, and a stat-keyed fast path for file digests."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from .files import atomic_write_bytes

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
#: A sha256 digest as this package writes it: 64 lowercase hex digits.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def canonical_json(value: Any) -> str:
    """Serialise ``value`` deterministically: sorted keys, no whitespace, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def sha256_text(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented, key-sorted JSON (stable bytes), atomically."""
    text = json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_canonical_json(path: Path, value: Any) -> None:
    """Write ``value`` as :func:`canonical_json` (stable bytes), atomically: for files of
    thousands of entries that no one reads by eye (dependency sets, the digest index), which
    json's C encoder serialises only without indentation, several times faster."""
    atomic_write_bytes(path, canonical_json(value).encode("utf-8"))


#: What an index entry keys on besides the path: a file replaced by other bytes changes at least
#: one of these, even when its size and mtime were restored (``cp -p``, ``rsync -t``): the
#: inode changes when it is replaced, and ctime, which no user can set back, when it is written.
_STAT_FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def _stat_key(st: os.stat_result) -> list[int]:
    return [int(getattr(st, name)) for name in _STAT_FIELDS]


#: Digests this process computed, under the same stat-key rule as :class:`FileDigestIndex`:
#: ``{absolute path: [*stat key, digest]}``. Each cache keeps its own index file, and one
#: process that builds into several caches (a test run, a sweep's jobs in one worker) would
#: otherwise hash the thousands of library files a dependency set names once per cache.
_PROCESS_DIGESTS: dict[str, list[Any]] = {}


def _hashed(path: str, stat_key: list[int]) -> tuple[str, bool]:
    """The sha256 of ``path`` whose stat key is ``stat_key``, and whether it may be remembered
    under that key: from this process's digests when the key still matches, else read."""
    known = _PROCESS_DIGESTS.get(path)
    if known is not None and known[:-1] == stat_key:
        return str(known[-1]), True
    value = sha256_file(Path(path))
    # Stat again after reading: a file written while it was hashed must not be remembered
    # under the new stat with the old content's digest.
    stable = _stat_key(os.stat(path)) == stat_key
    if stable:
        _PROCESS_DIGESTS[path] = [*stat_key, value]
    return value, stable


class JsonMemo:
    """A dict kept in a JSON file: loaded on first use, written back (atomically) when changed.

    Only a cache of what can be computed again: an unreadable or malformed file is ignored with
    a WARNING, and entries that :meth:`_valid` rejects are dropped.

    Args:
        path: The file, or None to keep the memo in memory only.
        read_only: Never write the file.
    """

    #: What the file is, for log lines.
    what = "memo"

    def __init__(self, path: Path | None, *, read_only: bool = False) -> None:
        self._path = path
        self._read_only = read_only
        self._entries: dict[str, Any] | None = None
        self._dirty = False

    def _valid(self, value: Any) -> bool:
        return True

    def _load(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = {}
            if self._path is not None and self._path.is_file():
                try:
                    data = json.loads(self._path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as e:
                    log.warning("ignoring unreadable %s %s: %s", self.what, self._path, e)
                    data = None
                if isinstance(data, dict):
                    self._entries = {k: v for k, v in data.items() if self._valid(v)}
        return self._entries

    def _set(self, key: str, value: Any) -> None:
        self._load()[key] = value
        self._dirty = True

    def save(self) -> None:
        """Write the file if it changed (never for an in-memory or read-only memo)."""
        if self._path is not None and self._dirty and not self._read_only:
            atomic_write_canonical_json(self._path, self._load())
            self._dirty = False


class FileDigestIndex(JsonMemo):
    """Digests of files keyed by absolute path, reused while the file's stat is unchanged.

    This is the fast path that keeps a no-op build from re-hashing large checkpoints: a file is
    re-hashed when its device, inode, size, mtime_ns or ctime_ns differs from the recorded
    one. Entries of an older format (size and mtime only) are ignored, so they re-hash once.

    Args:
        path: Where the index is persisted (JSON), or None to keep it in memory only.
    """

    what = "digest index"

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)

    def _valid(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) == len(_STAT_FIELDS) + 1

    def digest(self, path: Path) -> str:
        """The sha256 of ``path``, from the index when its stat key still matches."""
        return self.digest_at(str(path.resolve()))

    def digest_at(self, path: str) -> str:
        """:meth:`digest` of an absolute path as given, not resolved: the fast path for the
        thousands of library files a dependency set validates (the stat key still decides)."""
        stat_key = _stat_key(os.stat(path))
        known = self._load().get(path)
        if known is not None and known[:-1] == stat_key:
            return str(known[-1])
        value, stable = _hashed(path, stat_key)
        if stable:
            self._set(path, [*stat_key, value])
        return value

    def remember(self, path: Path, digest: str) -> None:
        """Record that ``path`` (as it is now on disk) has content ``digest``."""
        path = path.resolve()
        self._set(str(path), [*_stat_key(path.stat()), digest])

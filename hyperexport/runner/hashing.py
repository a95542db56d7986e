"""Canonical JSON, content digests, atomic writes, and a size/mtime fast path for file digests."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_bytes

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


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


class FileDigestIndex:
    """Digests of files keyed by absolute path, reused while size and mtime are unchanged.

    This is the fast path that keeps a no-op build from re-hashing large checkpoints: a file is
    re-hashed only when its size or modification time differs from the recorded one.

    Args:
        path: Where the index is persisted (JSON), or None to keep it in memory only.
    """

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[str, list[Any]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, list[Any]]:
        if self._entries is None:
            self._entries = {}
            if self._path is not None and self._path.is_file():
                try:
                    data = json.loads(self._path.read_text(encoding="utf-8"))
                except (OSError, ValueError) as e:
                    log.warning("ignoring unreadable digest index %s: %s", self._path, e)
                    data = {}
                if isinstance(data, dict):
                    self._entries = {
                        k: v for k, v in data.items() if isinstance(v, list) and len(v) == 3
                    }
        return self._entries

    def digest(self, path: Path) -> str:
        """The sha256 of ``path``, from the index when size and mtime_ns still match."""
        path = path.resolve()
        st = path.stat()
        entries = self._load()
        known = entries.get(str(path))
        if known is not None and known[0] == st.st_size and known[1] == st.st_mtime_ns:
            return str(known[2])
        value = sha256_file(path)
        entries[str(path)] = [st.st_size, st.st_mtime_ns, value]
        self._dirty = True
        return value

    def remember(self, path: Path, digest: str) -> None:
        """Record that ``path`` (as it is now on disk) has content ``digest``."""
        path = path.resolve()
        st = path.stat()
        self._load()[str(path)] = [st.st_size, st.st_mtime_ns, digest]
        self._dirty = True

    def save(self) -> None:
        """Persist the index if it changed (no-op for an in-memory index)."""
        if self._path is not None and self._dirty:
            atomic_write_json(self._path, self._load())
            self._dirty = False

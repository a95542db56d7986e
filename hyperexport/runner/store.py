"""The content-addressed cache: an action map (stage key -> output digests) plus blobs.

Layout under the cache root::

    blobs/<aa>/<sha256>          file contents, named by their digest (read-only)
    actions/<aa>/<key>.json      one committed stage run: its output files and their digests;
                                 the file's mtime is the entry's last use (refreshed on every hit)
    runs/<recipe>/<stage>.json   the key material of the last build of a recipe (for reasons)
    index/files.json             size/mtime -> digest fast path
    tmp/                         scratch directories of running stages (same filesystem)

Writes go to a temporary name and are renamed into place; an action entry is written only after
all its blobs exist, so a crash never leaves an entry pointing at missing data. Only JSON and the
stage's own files are stored; nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hyperexport.runner.hashing import FileDigestIndex, atomic_write_json, sha256_file

log = logging.getLogger(__name__)

ENV_CACHE_DIR = "HYPEREXPORT_CACHE_DIR"
ENTRY_FORMAT = 1
# Blobs up to this size are fully re-hashed when an entry is looked up; larger ones are checked
# by size there and by digest whenever they are copied out.
VERIFY_LIMIT = 4 << 20


def default_cache_dir(configured: str | os.PathLike[str] | None = None) -> Path:
    """``configured``, else ``$HYPEREXPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    if configured:
        return Path(configured).expanduser().resolve()
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return (base / "hyperexport").resolve()


@dataclass(frozen=True)
class OutputFile:
    """One output file of a stage run."""

    path: str
    digest: str
    size: int


@dataclass(frozen=True)
class ActionEntry:
    """A committed stage run: the files it produced, by content digest."""

    key: str
    stage: str
    outputs: tuple[OutputFile, ...]
    # The recipe whose build computed the entry (shown by ``cache ls``; not part of the key).
    recipe: str | None = None

    def digests(self) -> dict[str, str]:
        """``{relative path: digest}``: what later stages' keys include."""
        return {f.path: f.digest for f in self.outputs}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": ENTRY_FORMAT,
            "key": self.key,
            "stage": self.stage,
            "outputs": [[f.path, f.digest, f.size] for f in self.outputs],
        }
        if self.recipe is not None:
            data["recipe"] = self.recipe
        return data

    @classmethod
    def from_json(cls, data: Any) -> ActionEntry:
        if not isinstance(data, dict) or data.get("format") != ENTRY_FORMAT:
            raise ValueError("unknown entry format")
        outputs = tuple(OutputFile(str(p), str(d), int(s)) for p, d, s in data["outputs"])
        for f in outputs:
            if not re.fullmatch(r"[0-9a-f]{64}", f.digest) or _unsafe_relpath(f.path):
                raise ValueError(f"bad output record {f}")
        recipe = data.get("recipe")
        return cls(
            key=str(data["key"]),
            stage=str(data["stage"]),
            outputs=outputs,
            recipe=recipe if isinstance(recipe, str) else None,
        )


@dataclass(frozen=True)
class Lookup:
    """Result of :meth:`CacheStore.lookup`."""

    status: Literal["hit", "missing", "corrupt"]
    entry: ActionEntry | None = None
    detail: str = ""


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _unsafe_relpath(path: str) -> bool:
    p = Path(path)
    return p.is_absolute() or ".." in p.parts or not path


class CacheStore:
    """The cache at ``root``. With ``read_only`` (dry runs) nothing is created or deleted.

    Args:
        root: Cache directory (created lazily on the first write).
        read_only: Never write, delete or create anything.
    """

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only
        self.index = FileDigestIndex(None if read_only else root / "index" / "files.json")
        self._use_warned = False

    # -- paths -------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def action_path(self, key: str) -> Path:
        return self.root / "actions" / key[:2] / f"{key}.json"

    def run_record_path(self, recipe: str, stage: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", recipe) or "_"
        return self.root / "runs" / safe / f"{stage}.json"

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, key: str) -> Lookup:
        """Find and validate the entry of ``key``. A corrupt entry is warned about and removed."""
        path = self.action_path(key)
        if not path.is_file():
            return Lookup("missing")
        try:
            entry = ActionEntry.from_json(json.loads(path.read_text(encoding="utf-8")))
            if entry.key != key:
                raise ValueError(f"entry records key {entry.key[:12]}")
            for f in entry.outputs:
                self._verify_blob(f, full=f.size <= VERIFY_LIMIT)
        except (OSError, ValueError, KeyError, TypeError) as e:
            detail = f"{type(e).__name__}: {e}"
            log.warning("cache entry %s is corrupt (%s); treating it as a miss", key[:12], detail)
            if not self.read_only:
                path.unlink(missing_ok=True)
            return Lookup("corrupt", detail=detail)
        if not self.mark_used(key):  # removed meanwhile (cache gc): its blobs may go too
            return Lookup("missing")
        return Lookup("hit", entry)

    def _verify_blob(self, f: OutputFile, *, full: bool) -> None:
        blob = self.blob_path(f.digest)
        try:
            size = blob.stat().st_size
        except FileNotFoundError as e:
            raise ValueError(f"blob of {f.path} is missing") from e
        bad = size != f.size or (full and sha256_file(blob) != f.digest)
        if bad:
            if not self.read_only:
                blob.unlink(missing_ok=True)
            raise ValueError(f"blob of {f.path} does not match its digest")

    # -- writes ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scratch(self, prefix: str) -> Iterator[Path]:
        """A fresh directory on the cache's filesystem, removed on exit."""
        if self.read_only:
            raise RuntimeError("a read-only cache has no scratch space")
        base = self.root / "tmp"
        base.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def commit(
        self, key: str, stage: str, out_dir: Path, *, recipe: str | None = None
    ) -> ActionEntry:
        """Move every file of ``out_dir`` into the blob store, then write the entry (last).

        ``recipe`` (the building recipe's name) is recorded in the entry for ``cache ls``.
        """
        if self.read_only:
            raise RuntimeError("cannot commit to a read-only cache")
        outputs = []
        for path in sorted(p for p in out_dir.rglob("*") if p.is_file() or p.is_symlink()):
            if path.is_symlink():
                raise ValueError(f"stage {stage} produced a symlink {path.name}; not cacheable")
            rel = path.relative_to(out_dir).as_posix()
            digest = sha256_file(path)
            size = path.stat().st_size
            self._put_blob(path, digest, size)
            outputs.append(OutputFile(rel, digest, size))
        entry = ActionEntry(key=key, stage=stage, outputs=tuple(outputs), recipe=recipe)
        atomic_write_json(self.action_path(key), entry.to_json())
        return entry

    def _put_blob(self, src: Path, digest: str, size: int) -> None:
        blob = self.blob_path(digest)
        if self._reusable(blob, size):
            return
        blob.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=blob.parent, prefix=f".{digest[:12]}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(src, tmp)
            os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
            os.replace(tmp, blob)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def checkout(self, entry: ActionEntry, dest: Path, *, link: bool = True) -> None:
        """Materialise ``entry``'s files under ``dest``: hard links when ``link``, else copies.

        Copies are verified against their digest while written.
        """
        for f in entry.outputs:
            target = dest / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            blob = self.blob_path(f.digest)
            if link:
                try:
                    os.link(blob, target)
                    continue
                except OSError:
                    pass
            self.copy_blob(f, target)

    def copy_blob(self, f: OutputFile, target: Path) -> None:
        """Copy one blob to ``target`` atomically, checking its digest; raises ValueError if bad."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(self.blob_path(f.digest), tmp)
            os.chmod(tmp, 0o644)
            if sha256_file(Path(tmp)) != f.digest:
                self.blob_path(f.digest).unlink(missing_ok=True)
                raise ValueError(f"cached blob of {f.path} is corrupt")
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def read_text(self, entry: ActionEntry, path: str) -> str | None:
        """Contents of one small output file of ``entry`` (None if it has no such file)."""
        for f in entry.outputs:
            if f.path == path:
                return self.blob_path(f.digest).read_text(encoding="utf-8")
        return None

    # -- previous runs (for reasons) ---------------------------------------------------------
    def previous_run(self, recipe: str, stage: str) -> dict[str, Any] | None:
        """The record written by :meth:`record_run` for this recipe and stage, if readable."""
        path = self.run_record_path(recipe, stage)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable run record %s: %s", path, e)
            return None
        return data if isinstance(data, dict) else None

    def record_run(self, recipe: str, stage: str, record: dict[str, Any]) -> None:
        """Remember the key material (and outcome) of this recipe's latest run of ``stage``."""
        if not self.read_only:
            atomic_write_json(self.run_record_path(recipe, stage), record)

    def save_index(self) -> None:
        if not self.read_only:
            self.index.save()

    # -- inventory (for the ``cache`` commands: ls, show, verify, gc) ----------------------
    def mark_used(self, key: str) -> bool:
        """Record a use of ``key``'s entry (its file's mtime) for least-recently-used eviction.

        ``cache gc`` re-reads an entry's time after taking it out of place and puts it back if
        it was used meanwhile, so a hit recorded here is never evicted under a running build.

        Returns:
            False if the entry file is gone (evicted meanwhile); True otherwise, also when the
            time cannot be written (read-only store or filesystem; logged once).
        """
        if self.read_only:
            return True
        try:
            os.utime(self.action_path(key))
        except FileNotFoundError:
            return False
        except OSError as e:
            if not self._use_warned:
                log.warning("cannot record the last use of cache entries in %s (%s)", self.root, e)
                self._use_warned = True
        return True

    def _reusable(self, blob: Path, size: int) -> bool:
        """Whether ``blob`` is there with ``size`` bytes; if so, give it a fresh mtime, so that
        ``cache gc`` (which never deletes a blob younger than its grace period, and re-reads the
        time after taking a blob out of place) keeps it for the entry being committed.

        False when it is missing or gone meanwhile: the caller writes it (again).
        """
        try:
            st = blob.stat()
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        try:
            os.utime(blob)
        except FileNotFoundError:
            return False
        except OSError as e:  # e.g. a shared cache where another user owns the blob
            log.warning("cannot refresh the time of %s (%s); a concurrent gc may drop it", blob, e)
        return True

    def entry_paths(self) -> Iterator[tuple[str, Path]]:
        """``(key, path)`` of every action entry file (by name; contents not read)."""
        for path in sorted((self.root / "actions").glob("??/*.json")):
            key = path.name.removesuffix(".json")
            if _DIGEST.fullmatch(key) and path.parent.name == key[:2]:
                yield key, path

    def blob_paths(self) -> Iterator[tuple[str, Path]]:
        """``(digest, path)`` of every blob (temporary files of running writes excluded)."""
        for path in sorted((self.root / "blobs").glob("??/*")):
            if _DIGEST.fullmatch(path.name) and path.parent.name == path.name[:2]:
                yield path.name, path

    def read_entry(self, key: str) -> ActionEntry:
        """Parse ``key``'s entry without checking its blobs.

        Raises:
            OSError: It cannot be read (FileNotFoundError: there is none).
            ValueError: It is not a valid entry of ``key``.
        """
        try:
            entry = ActionEntry.from_json(
                json.loads(self.action_path(key).read_text(encoding="utf-8"))
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from e
        if entry.key != key:
            raise ValueError(f"entry records key {entry.key[:12]}")
        return entry

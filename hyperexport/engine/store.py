"""The content-addressed cache: an action map (stage key -> output digests) plus blobs.

Layout under the cache root::

    blobs/<aa>/<sha256>          file contents, named by their digest (read-only)
    actions/<aa>/<key>.json      one committed stage run: its output files and their digests;
                                 the file's mtime is the entry's last use (refreshed on every hit)
    runs/<build>/<stage>.json    the key material of a build's last run of a stage (for reasons)
    index/files.json             size/mtime -> digest fast path
    index/record-secret          keys the digests of env values in runs/ (``record_secret.py``)
    tmp/<name>/                  scratch folders of running builds (same filesystem: a stage's
                                 output files are moved into blobs/, not copied)
    locks/                       per-key and per-scratch lock files (see ``process_locks.py``)

Rules the maintenance (``inventory.py``, ``collector.py``, ``verify.py``, ``sync.py``) and
other tools rely on:

* Writes go to a temporary name and are renamed into place. **Blobs are written before the
  entry that names them**: a reader (or a crash) never meets an entry pointing at missing data.
  A collector must therefore delete an entry before its blobs, and never a blob that an entry
  names.
* Everything read back is data: entries are JSON, checked against their key; blobs are checked
  against their digest (fully up to :data:`VERIFY_LIMIT` on lookup, always when copied out:
  a build's checkouts, ``workspace.py``, and publishing).
  A bad entry or blob is a WARNING and a miss, and is removed; nothing is unpickled, imported
  or called by a name the cache holds.
* A scratch folder belongs to a live build while its lock is held
  (:func:`~.process_locks.scratch_is_live`).

A cache the process cannot write to still serves hits (:func:`open_store`); a stage that must
run then fails with :class:`~.errors.CacheUnavailableError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from . import process_locks
from .entries import ActionEntry, OutputFile
from .errors import CacheUnavailableError
from .files import clone_or_copy, clone_or_copy_hashed
from .hashing import SHA256_HEX, FileDigestIndex, atomic_write_json, sha256_file
from .sourced import (
    REF_SUFFIX,
    FileSources,
    Piece,
    SourcesError,
    assemble,
    blob_digest,
    blob_source,
    matching_digest,
)

if TYPE_CHECKING:
    from .remote import Remote

log = logging.getLogger(__name__)

# Blobs up to this size are fully re-hashed when an entry is looked up; larger ones are checked
# by size there and by digest whenever they are copied out.
VERIFY_LIMIT = 4 << 20
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


class CorruptBlobError(ValueError):
    """A blob does not match its digest (or is missing) while copied out; it has been removed."""

    def __init__(self, path: str, digest: str) -> None:
        self.path = path
        self.digest = digest
        super().__init__(f"cached blob of {path} ({digest[:12]}) is corrupt")


#: What a lookup found: a complete, verified entry; nothing; an entry that failed its checks.
HIT: Final = "hit"
MISSING: Final = "missing"
CORRUPT: Final = "corrupt"


@dataclass(frozen=True)
class Lookup:
    """Result of :meth:`CacheStore.lookup`."""

    status: Literal["hit", "missing", "corrupt"]
    entry: ActionEntry | None = None
    detail: str = ""


class Keeper(Protocol):
    """Who keeps a committed file as a verified copy for later readers (the build's
    :class:`~.workspace.Workspace`), so that the next stage's checkout is a move, not a copy."""

    def wants(self, size: int) -> bool:
        """Whether a file of ``size`` bytes is worth keeping (a large one)."""

    def adopt(self, path: Path, digest: str) -> None:
        """Take ``path``, whose bytes have digest ``digest``, out of the stage's scratch."""


def open_store(
    root: Path,
    *,
    dry_run: bool = False,
    remote: Remote | None = None,
    configured_by: str = "",
    writable_hint: str = "",
) -> CacheStore:
    """Open the cache at ``root`` for a build, checking first that it can be used.

    A missing cache directory is created. One this process cannot write to (a read-only
    mount, a restored read-only CI tier) is opened read-only: it serves hits, and a stage that
    must run raises :class:`CacheUnavailableError` (see :meth:`CacheStore.require_writable`).

    Args:
        root: The cache directory.
        dry_run: Plan only: open read-only, create nothing.
        remote: The remote tier, if any (see ``remote.py``).
        configured_by: Where the directory was set, for the messages (``"build.cache_dir"``).
        writable_hint: What to do when a stage must run and it is read-only (for the message
            of :meth:`CacheStore.require_writable`).

    Raises:
        CacheUnavailableError: ``root`` (or a parent) is not a directory, or cannot be created.
    """
    if root.exists() and not root.is_dir():
        where = f" ({configured_by})" if configured_by else ""
        raise CacheUnavailableError(f"cache directory {root} is not a directory{where}")
    if dry_run:
        return CacheStore(root, read_only=True, remote=remote, writable_hint=writable_hint)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheUnavailableError(
            f"cannot create cache directory {root}: {e.strerror or e}"
        ) from e
    try:
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        log.warning("cache %s is not writable (%s): serving hits only", root, reason)
        return CacheStore(root, read_only=True, unwritable=reason, writable_hint=writable_hint)
    store = CacheStore(root, remote=remote, writable_hint=writable_hint)
    process_locks.remove_dead_scratch(root)
    return store


class CacheStore:
    """The cache at ``root``.

    Read-only stores never create, write or delete anything: a dry run's store, and a cache
    this process cannot write to (``unwritable`` says why), which still serves hits.

    Args:
        root: Cache directory (created lazily on the first write).
        read_only: Never write, delete or create anything.
        unwritable: Why the cache cannot be written (implies ``read_only``); None if it can.
        remote: A remote tier: a local miss is looked up there, and committed entries are
            uploaded to it (see ``remote.py``). Used only by stores that can write, and by dry
            runs (which read remote entries without downloading their blobs).
        writable_hint: What to do when a stage must run and the store is read-only.
    """

    def __init__(
        self,
        root: Path,
        *,
        read_only: bool = False,
        unwritable: str | None = None,
        remote: Remote | None = None,
        writable_hint: str = "",
    ) -> None:
        self.root = root
        self.writable_hint = writable_hint or "make it writable"
        self.unwritable = unwritable
        self.read_only = read_only or unwritable is not None
        self.remote = remote if unwritable is None else None
        self.index = FileDigestIndex(None if self.read_only else root / "index" / "files.json")
        self._use_warned = False

    # -- paths -------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest

    def ref_path(self, digest: str) -> Path:
        """Where blob ``digest`` is recorded by reference, when it is (``sourced.py``)."""
        return self.root / "blobs" / digest[:2] / f"{digest}{REF_SUFFIX}"

    def action_path(self, key: str) -> Path:
        return self.root / "actions" / key[:2] / f"{key}.json"

    def run_record_path(self, build: str, stage: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", build) or "_"
        return self.root / "runs" / safe / f"{stage}.json"

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, key: str) -> Lookup:
        """Find and validate the entry of ``key``; on a local miss, try the remote tier.

        A corrupt entry (bad JSON, wrong key, a blob missing or not matching its digest) is
        warned about, removed (unless read-only) and reported as ``corrupt``.
        """
        found = self.lookup_local(key)
        if found.status == HIT or self.remote is None:
            return found
        if self.read_only:  # a dry run: the remote entry says what would be fetched
            entry = self.remote.read_entry(key)
            return Lookup(HIT, entry, detail="remote") if entry is not None else found
        if self.remote.fetch(key, self):
            fetched = self.lookup_local(key)
            if fetched.status == HIT:
                return Lookup(HIT, fetched.entry, detail="remote")
        return found

    def lookup_local(self, key: str) -> Lookup:
        """Like :meth:`lookup`, in the local store only."""
        path = self.action_path(key)
        if not path.is_file():
            return Lookup(MISSING)
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
            return Lookup(CORRUPT, detail=detail)
        if not self.mark_used(key):  # removed meanwhile (the collector): its blobs may go too
            return Lookup(MISSING)
        return Lookup(HIT, entry)

    def discard(self, key: str) -> None:
        """Drop the entry of ``key`` (its blobs stay until collected); no-op when read-only."""
        if not self.read_only:
            self.action_path(key).unlink(missing_ok=True)

    def require_writable(self, stage: str) -> None:
        """Raise :class:`CacheUnavailableError` when ``stage`` must run and the cache is read-only.

        The policy for a miss in a cache that cannot be written: fail before the stage runs,
        with one line naming the directory (exit code 3), rather than build uncached.
        """
        if self.unwritable is not None:
            raise CacheUnavailableError(
                f"cache directory {self.root} is read-only ({self.unwritable}) and stage "
                f"{stage!r} must run: {self.writable_hint}"
            )

    def _verify_blob(self, f: OutputFile, *, full: bool) -> None:
        blob = self.blob_path(f.digest)
        try:
            size = blob.stat().st_size
        except FileNotFoundError as e:
            if self._sources_hold(f):
                return  # checked in full when a checkout assembles it
            raise ValueError(f"blob of {f.path} is missing") from e
        bad = size != f.size or (full and sha256_file(blob) != f.digest)
        if bad:
            if not self.read_only:
                blob.unlink(missing_ok=True)
            raise ValueError(f"blob of {f.path} does not match its digest")

    # -- writes ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scratch(self, prefix: str) -> Iterator[Path]:
        """A fresh directory on the cache's filesystem, removed on exit.

        It is tied to a lock held while the block runs, so a later build (or the collector) can
        tell it from the scratch of a dead build (:func:`process_locks.remove_dead_scratch`).
        """
        if self.read_only:
            raise RuntimeError("a read-only cache has no scratch space")
        with process_locks.scratch_dir(self.root, prefix) as path:
            yield path

    @contextlib.contextmanager
    def single_flight(self, key: str, what: str) -> Iterator[None]:
        """Hold the lock of ``key`` while computing its entry (see :func:`process_locks.single_flight`)."""
        if self.read_only:
            yield
            return
        with process_locks.single_flight(self.root, key, what):
            yield

    def commit(
        self,
        key: str,
        stage: str,
        out_dir: Path,
        *,
        build: str | None = None,
        params: Mapping[str, Any] | None = None,
        known: Callable[[Path], str | None] | None = None,
        keep: Keeper | None = None,
        sources: Mapping[str, FileSources] | None = None,
        inputs: Callable[[Path], str | None] | None = None,
    ) -> ActionEntry:
        """Move every file of ``out_dir`` into the blob store, then write the entry (last).

        A regular file is hashed once and *moved* into ``blobs/`` (``out_dir`` is scratch space
        on the cache's filesystem), made read-only; when its blob is already there the file is
        left for the scratch folder's removal. A file ``keep`` wants is instead copied into
        ``blobs/`` and hashed as it is copied (one read), and the file itself is handed to
        ``keep``: a later stage's checkout of it is then a move, where a moved blob would be
        copied out and hashed again. A symlink is stored only when ``known`` vouches
        for the file it names (an input this build checked out and verified, unchanged since,
        see ``workspace.py``): it is recorded under that file's digest, whose blob the store
        already has, without reading or copying anything. Any other symlink is refused.

        A file ``keep`` wants that ``sources`` (``{relative path: where its bytes are}``)
        describes is compared with those ranges, hashed on the way; when it matches, the blob is
        recorded by reference (``sourced.py``) and nothing is copied. When it does not, a WARNING
        says so and the file is copied in as any other. A declaration that carries the file's
        digest (its writer compared and hashed as it wrote, ``FileSources.digest``) is taken
        with its size checked, without reading the file.

        A range of a declared source that is an input of this build is resolved through
        ``inputs`` (else ``known``): the input's digest, also for an input the stage took over
        (moved or changed, ``StageInputs.take``), whose bytes the store still holds.

        ``build`` (the name of the build) is recorded in the entry for the inventory, and
        ``params`` (the stage's params as keyed) for :func:`~.verify.verify`, which recomputes
        the stage's declared outputs from them.

        Raises:
            ValueError: ``out_dir`` holds a symlink ``known`` does not vouch for.
        """
        if self.read_only:
            raise RuntimeError("cannot commit to a read-only cache")
        outputs = []
        for path in sorted(p for p in out_dir.rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(out_dir).as_posix()
            if path.is_symlink():
                digest = known(path) if known is not None else None
                if digest is None:
                    raise ValueError(
                        f"stage {stage} produced a symlink {rel} to a file this build did not "
                        "check out; not cacheable"
                    )
                size = path.stat().st_size
                self._put_blob(path, digest, size, move=False)
            elif keep is not None and keep.wants(size := path.stat().st_size):
                declared = (sources or {}).get(rel)
                found = (
                    self._record_sources(path, declared, stage, rel, inputs or known)
                    if declared
                    else None
                )
                digest = found or self._copy_in(path, size)
                keep.adopt(path, digest)
            else:
                digest = sha256_file(path)
                size = path.stat().st_size
                self._put_blob(path, digest, size, move=True)
            outputs.append(OutputFile(rel, digest, size))
        entry = ActionEntry(
            key=key, stage=stage, outputs=tuple(outputs), build=build, params=dict(params or {})
        )
        self.write_entry(entry)
        if self.remote is not None:
            self.remote.upload(entry, self)
        return entry

    def write_entry(self, entry: ActionEntry) -> None:
        """Write ``entry`` atomically; every blob it names must already be in the store."""
        atomic_write_json(self.action_path(entry.key), entry.to_json())

    def adopt_blob(self, verified: Path, digest: str) -> None:
        """Move ``verified`` (a file beside the blob's place, checked against ``digest`` by the
        caller) into place as blob ``digest``."""
        os.chmod(verified, _READ_ONLY)
        os.replace(verified, self.blob_path(digest))

    def _record_sources(
        self,
        path: Path,
        declared: FileSources,
        stage: str,
        rel: str,
        known: Callable[[Path], str | None] | None,
    ) -> str | None:
        """Record ``path``'s blob as ``declared`` if its bytes are exactly those; its digest.

        A range of a file ``known`` vouches for (an input of this build, checked out) is
        resolved first: through that input's own record when it is held by reference, else to
        its blob. None (after a WARNING naming the stage and file) when the declaration does not
        hold, names an input the store holds neither way, or cannot be read.
        """
        why = ""
        try:
            sources = self._resolved(declared, known)
            digest = (
                declared.digest
                if declared.digest is not None and path.stat().st_size == declared.size
                else matching_digest(path, sources, self.resolve_source)
            )
        except (OSError, SourcesError) as e:
            digest, why = None, f"{type(e).__name__}: {e}"
        if digest is None:
            log.warning(
                "stage %s declared where the bytes of %s are, but %s; storing a copy",
                stage,
                rel,
                why or "its bytes differ from the declared ranges",
            )
            return None
        if self._reusable(self.blob_path(digest), sources.size):
            return digest
        held = self.sources_of(digest)
        if held is not None and held != sources:
            # Another build recorded these bytes elsewhere (a cache shared by machines whose
            # checkpoints are at other paths): store the bytes, which serve every machine,
            # rather than take the record from the builds that can read it.
            log.info(
                "%s: %s is recorded by reference to other files; storing its bytes", stage, rel
            )
            return None
        for blob in sources.blobs():  # keep them from a concurrent collection
            self._reusable(self.blob_path(blob), None)
        ref = self.ref_path(digest)
        ref.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(ref, sources.to_json())
        log.debug(
            "%s: recorded %s (%.2f GB) by reference to %d ranges",
            stage,
            rel,
            sources.size / 1e9,
            len(sources.pieces),
        )
        return digest

    def _resolved(
        self, declared: FileSources, known: Callable[[Path], str | None] | None
    ) -> FileSources:
        """``declared`` with every range of a checked-out input replaced by where that input's
        bytes are kept (its record's ranges, or its blob).

        Raises:
            SourcesError: A range names an input the store holds neither way.
        """
        pieces: list[Piece] = []
        for piece in declared.pieces:
            digest = known(Path(piece.source)) if known and piece.data is None else None
            if digest is None or blob_digest(piece.source) is not None:
                pieces.append(piece)
                continue
            record = self.sources_of(digest)
            if record is not None:
                pieces.extend(record.through(piece))
            elif self.blob_path(digest).is_file():
                pieces.append(
                    Piece(piece.offset, piece.length, blob_source(digest), piece.source_offset)
                )
            else:
                raise SourcesError(
                    f"input {piece.source} is in the cache neither as bytes nor ranges"
                )
        return FileSources(declared.size, tuple(pieces))

    def resolve_source(self, source: str) -> str:
        """The file a record's source names: a ``blob:`` source is this store's blob."""
        digest = blob_digest(source)
        return source if digest is None else str(self.blob_path(digest))

    def sources_of(self, digest: str) -> FileSources | None:
        """The record of blob ``digest`` by reference, if there is one and it is readable."""
        try:
            text = self.ref_path(digest).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            return FileSources.loads(text)
        except SourcesError as e:
            log.warning("cache record of blob %s is unreadable (%s)", digest[:12], e)
            return None

    def _sources_hold(self, f: OutputFile) -> bool:
        """Whether ``f``'s blob is recorded by reference with its size, and every source is
        still a file long enough for its ranges (the bytes are checked when assembled)."""
        sources = self.sources_of(f.digest)
        if sources is None or sources.size != f.size:
            return False
        for p in sources.pieces:
            if p.data is not None:
                continue
            try:
                if os.stat(self.resolve_source(p.source)).st_size < p.source_offset + p.length:
                    return False
            except OSError:
                return False
        return True

    def has_blob(self, f: OutputFile) -> bool:
        """Whether the store holds ``f``'s bytes: its blob with its size, or a record of them."""
        blob = self.blob_path(f.digest)
        if blob.is_file() and blob.stat().st_size == f.size:
            return True
        sources = self.sources_of(f.digest)
        return sources is not None and sources.size == f.size

    @contextlib.contextmanager
    def materialized(self, f: OutputFile) -> Iterator[Path]:
        """A regular file with ``f``'s bytes, checked against its digest (hashed once): its blob,
        or one assembled from its record (in the store's scratch space, removed after).

        Raises:
            CorruptBlobError: Neither is there, or its bytes do not match the digest.
        """
        blob = self.blob_path(f.digest)
        if blob.is_file():
            if sha256_file(blob) != f.digest:
                raise CorruptBlobError(f.path, f.digest)
            yield blob
            return
        with self.scratch("assemble-") as folder:
            target = folder / f.digest
            self.copy_blob(f, target)
            yield target

    def _copy_in(self, src: Path, size: int) -> str:
        """Copy ``src`` into the blob store, hashing it on the way; return its digest.

        The copy goes to a temporary name in ``blobs/`` (what the collector removes if this
        process dies) and is renamed to its digest's place, unless that blob is already there.
        """
        tmp = self.root / "blobs" / f".incoming.{secrets.token_hex(4)}.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            _, digest = clone_or_copy_hashed(src, tmp)
            blob = self.blob_path(digest)
            if self._reusable(blob, size):
                tmp.unlink()
                return digest
            blob.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, _READ_ONLY)
            os.replace(tmp, blob)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return digest

    def _put_blob(self, src: Path, digest: str, size: int, *, move: bool) -> None:
        """Make blob ``digest`` hold ``src``'s bytes: kept if already there (its time refreshed),
        else ``src`` is moved into place (``move``) or copied (reflink where possible)."""
        blob = self.blob_path(digest)
        if self._reusable(blob, size) or self._reusable(self.ref_path(digest), None, size):
            return
        blob.parent.mkdir(parents=True, exist_ok=True)
        if move:
            try:
                os.chmod(src, _READ_ONLY)
                os.replace(src, blob)
                os.utime(blob)  # written now, for the collector's grace period
                return
            except OSError as e:  # the scratch space is on another filesystem
                log.warning("cannot move %s into the cache (%s); copying it", src.name, e)
        tmp = blob.parent / f".{digest[:12]}.{secrets.token_hex(4)}.tmp"
        try:
            clone_or_copy(src, tmp)
            os.chmod(tmp, _READ_ONLY)
            os.replace(tmp, blob)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def checkout(self, entry: ActionEntry, dest: Path) -> None:
        """Materialise ``entry``'s files under ``dest``: reflinks where possible, else copies.

        Every file is verified against its digest as it is written. (A build checks out through
        :class:`~.workspace.Workspace`, which holds a large blob once.)

        Raises:
            CorruptBlobError: A blob is missing or corrupt (it has been removed).
        """
        for f in entry.outputs:
            self.copy_blob(f, dest / f.path)

    def copy_blob(self, f: OutputFile, target: Path) -> None:
        """Clone (reflink or copy) one blob to ``target`` atomically, checking its digest.

        Raises:
            CorruptBlobError: The blob is missing or does not match its digest; it has been
                removed (unless the store is read-only), so a new lookup of its entry misses.
        """
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        blob = self.blob_path(f.digest)
        try:
            try:
                _, digest = clone_or_copy_hashed(blob, tmp)
            except FileNotFoundError as e:
                if not self._assemble(f, tmp):
                    raise CorruptBlobError(f.path, f.digest) from e
                digest = f.digest
            os.chmod(tmp, 0o644)
            if digest != f.digest:
                if not self.read_only:
                    blob.unlink(missing_ok=True)
                raise CorruptBlobError(f.path, f.digest)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _assemble(self, f: OutputFile, tmp: Path) -> bool:
        """Write ``f``'s bytes to ``tmp`` from its record by reference; False when there is none,
        or a source is gone or changed (the record is then removed, unless read-only)."""
        sources = self.sources_of(f.digest)
        if sources is None:
            return False
        try:
            with open(tmp, "wb") as fh:
                digest = assemble(sources, fh, self.resolve_source)
            why = "" if digest == f.digest else "the assembled bytes do not match the digest"
        except (OSError, SourcesError) as e:
            why = f"{type(e).__name__}: {e}"
        if not why:
            return True
        log.warning(
            "the cached bytes of %s were recorded by reference, and their sources changed (%s); "
            "a miss",
            f.path,
            why,
        )
        tmp.unlink(missing_ok=True)
        if not self.read_only:
            self.ref_path(f.digest).unlink(missing_ok=True)
        return False

    def read_text(self, entry: ActionEntry, path: str) -> str | None:
        """Contents of one small output file of ``entry`` (None if it has no such file)."""
        for f in entry.outputs:
            if f.path == path:
                return self.blob_path(f.digest).read_text(encoding="utf-8")
        return None

    # -- previous runs (for reasons) ---------------------------------------------------------
    def previous_run(self, build: str, stage: str) -> dict[str, Any] | None:
        """The record written by :meth:`record_run` for this build and stage, if readable."""
        path = self.run_record_path(build, stage)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable run record %s: %s", path, e)
            return None
        return data if isinstance(data, dict) else None

    def record_run(self, build: str, stage: str, record: dict[str, Any]) -> None:
        """Remember the key material (and outcome) of this build's latest run of ``stage``."""
        if not self.read_only:
            atomic_write_json(self.run_record_path(build, stage), record)

    def save_index(self) -> None:
        if not self.read_only:
            self.index.save()

    # -- inventory (for the maintenance: inventory, verify, collector) ---------------------
    def mark_used(self, key: str) -> bool:
        """Record a use of ``key``'s entry (its file's mtime) for least-recently-used eviction.

        The collector re-reads an entry's time after taking it out of place and puts it back if
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

    def _reusable(self, blob: Path, size: int | None, recorded: int | None = None) -> bool:
        """Whether ``blob`` is there with ``size`` bytes (a record by reference, ``size`` None:
        one of a file of ``recorded`` bytes); if so, give it a fresh mtime, so that the collector
        (which never deletes a blob younger than its grace period, and re-reads the time after
        taking a blob out of place) keeps it for the entry being committed.

        False when it is missing or gone meanwhile: the caller writes it (again).
        """
        try:
            st = blob.stat()
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
            return False
        if recorded is not None:
            sources = self.sources_of(blob.name.removesuffix(REF_SUFFIX))
            if sources is None or sources.size != recorded:
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
            if SHA256_HEX.fullmatch(key) and path.parent.name == key[:2]:
                yield key, path

    def blob_paths(self) -> Iterator[tuple[str, Path]]:
        """``(digest, path)`` of every blob (temporary files of running writes excluded)."""
        for path in sorted((self.root / "blobs").glob("??/*")):
            if SHA256_HEX.fullmatch(path.name) and path.parent.name == path.name[:2]:
                yield path.name, path

    def ref_paths(self) -> Iterator[tuple[str, Path]]:
        """``(digest, path)`` of every record of a blob by reference (``sourced.py``)."""
        for path in sorted((self.root / "blobs").glob(f"??/*{REF_SUFFIX}")):
            digest = path.name.removesuffix(REF_SUFFIX)
            if SHA256_HEX.fullmatch(digest) and path.parent.name == digest[:2]:
                yield digest, path

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

"""A remote tier of the cache on fsspec (``s3://``, ``gs://``, ``file://``, ...).

The remote mirrors the local layout (``actions/<aa>/<key>.json`` and ``blobs/<aa>/<digest>``)
under its URL. It is consulted only after a local miss, and filled only after a stage
succeeded, as Bazel's remote cache is:

* **Download**: the entry is read and checked (format, key, safe paths), then every blob it
  names is streamed to a temporary file beside the local blob store, checked against its size
  and digest, and moved in; the local entry is written last. A bad remote entry or blob is a
  WARNING and a miss (the stage runs and its upload replaces it).
* **Upload** (mode ``read_write``): blobs first, the entry last, so a reader never meets
  an entry whose blobs are missing. Object stores make each put atomic (a multipart upload,
  which s3fs uses for large files, streaming them from disk, appears only when completed); on
  other filesystems each object is written under a temporary name and moved into place.
  Blobs already on the remote are not uploaded again. A failed upload is a WARNING: the build
  still succeeds with its local result.
* mode ``read_only`` never writes (pull-request CI).
* **Discovered dependencies** (``deps/<aa>/<declared key>.json``, see ``discovered.py``): a
  stage that runs user code is stored under a full key found through this record, so the
  record travels too. A build whose local record has no set that holds merges in the remote's
  sets (:meth:`Remote.fetch_deps`); after computing such a stage it merges its sets into the
  remote's record, after the entry (:meth:`Remote.upload_deps`). Sets from another machine
  whose modules differ from this one's simply do not resolve: a miss, never a wrong hit.

Credentials and endpoints are fsspec's ``storage_options`` (the caller's, or the
environment: ``AWS_*`` for s3fs, ``FSSPEC_<PROTOCOL>_<OPTION>`` for any fsspec filesystem).
They are never written into reports or logs.

The remote is never collected by the engine: give it a retention rule of its own (for S3, a
bucket lifecycle rule expiring objects under the prefix after N days). Expiry may remove a
blob before its entry; a download then misses and the stage runs again, so it is safe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from .discovered import DEPS_FORMAT, MAX_SETS, set_digest
from .entries import ActionEntry, OutputFile
from .errors import CacheUnavailableError
from .hashing import atomic_write_canonical_json, sha256_file
from .settings import READ_WRITE, REMOTE_MODES


class LocalTier(Protocol):
    """What the remote tier needs of the local store it fetches into and uploads from."""

    def blob_path(self, digest: str) -> Path: ...

    def has_blob(self, f: OutputFile) -> bool: ...

    def materialized(self, f: OutputFile) -> contextlib.AbstractContextManager[Path]: ...

    def adopt_blob(self, verified: Path, digest: str) -> None: ...

    def write_entry(self, entry: ActionEntry) -> None: ...


log = logging.getLogger(__name__)

#: fsspec protocols whose single-object writes are atomic (no temporary name needed).
_ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss"})
#: An entry or dependency record is small JSON; a larger object is not one (a WARNING, a miss).
MAX_RECORD_BYTES = 64 << 20
_CHUNK = 1 << 20


class Remote:
    """The remote tier at ``url``.

    Args:
        url: An fsspec URL (``s3://bucket/prefix``, ``file:///srv/cache``, ...).
        mode: ``read_write`` or ``read_only`` (never writes).
        storage_options: Passed to the fsspec filesystem (credentials, ``endpoint_url``, ...).

    Raises:
        CacheUnavailableError: The URL's filesystem is unknown, its package is not installed,
            or the remote cannot be reached.
    """

    def __init__(
        self,
        url: str,
        *,
        mode: str = READ_WRITE,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        import fsspec

        if mode not in REMOTE_MODES:
            raise ValueError(f"remote mode {mode!r} is not one of {REMOTE_MODES}")
        self.url = url
        self.writable = mode == READ_WRITE
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ImportError, ValueError) as e:
            raise CacheUnavailableError(f"remote cache {url}: {e}") from e
        self.root = root.rstrip("/")
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self._atomic_put = bool(_ATOMIC_PUT & set(protocols))
        #: Blobs found not to match their digest here: the next upload replaces them.
        self._bad: set[str] = set()
        self._check()

    def _check(self) -> None:
        self.fs.invalidate_cache()  # fsspec reuses filesystem instances, listings included
        try:
            if self.writable and not self._atomic_put:
                self.fs.makedirs(self.root, exist_ok=True)
            self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            pass  # an empty remote (an S3 prefix exists only once an object is under it)
        except Exception as e:  # the filesystem's own errors (botocore, aiohttp, OSError, ...)
            raise CacheUnavailableError(
                f"remote cache {self.url} is unreachable: {type(e).__name__}: {e}"
            ) from e

    # -- paths -------------------------------------------------------------------------------
    def action_path(self, key: str) -> str:
        return f"{self.root}/actions/{key[:2]}/{key}.json"

    def blob_path(self, digest: str) -> str:
        return f"{self.root}/blobs/{digest[:2]}/{digest}"

    # -- reads -------------------------------------------------------------------------------
    def read_entry(self, key: str) -> ActionEntry | None:
        """The remote entry of ``key``, checked; None when absent or unusable (a WARNING)."""
        try:
            data = self._read_bounded(self.action_path(key), MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        except Exception as e:
            log.warning("remote cache %s: cannot read entry %s (%s)", self.url, key[:12], e)
            return None
        try:
            if len(data) > MAX_RECORD_BYTES:
                raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
            entry = ActionEntry.from_json(json.loads(data))
            if entry.key != key:
                raise ValueError(f"entry records key {entry.key[:12]}")
        except (ValueError, KeyError, TypeError) as e:
            log.warning("remote cache %s: entry %s is corrupt (%s); a miss", self.url, key[:12], e)
            return None
        return entry

    def fetch(self, key: str, store: LocalTier) -> bool:
        """Copy the entry of ``key`` and its blobs into ``store``; False on a miss or fault."""
        entry = self.read_entry(key)
        if entry is None:
            return False
        for f in entry.outputs:
            if store.has_blob(f):
                continue
            blob = store.blob_path(f.digest)
            blob.parent.mkdir(parents=True, exist_ok=True)
            tmp = blob.parent / f".{f.digest[:12]}.{secrets.token_hex(4)}.download"
            try:
                read = self._download(self.blob_path(f.digest), tmp, f.size)
                if read != f.size or sha256_file(tmp) != f.digest:
                    log.warning(
                        "remote cache %s: blob of %s does not match its digest%s; a miss%s",
                        self.url,
                        f.path,
                        f" (more than the declared {f.size} bytes)" if read > f.size else "",
                        " (this build replaces it with its own verified blob)"
                        if self.writable
                        else "",
                    )
                    self._bad.add(f.digest)  # never deleted there: replaced by a verified upload
                    return False
                store.adopt_blob(tmp, f.digest)
            except Exception as e:
                log.warning(
                    "remote cache %s: cannot download %s of entry %s (%s: %s); a miss",
                    self.url,
                    f.path,
                    key[:12],
                    type(e).__name__,
                    e,
                )
                return False
            finally:
                tmp.unlink(missing_ok=True)
        store.write_entry(entry)
        log.info("%s: fetched entry %s from the remote cache", entry.stage, key[:12])
        return True

    # -- writes ------------------------------------------------------------------------------
    def upload(self, entry: ActionEntry, store: LocalTier) -> None:
        """Upload ``entry``'s blobs (those not on the remote yet), then the entry itself.

        In ``read_only`` mode a WARNING says that nothing was uploaded; a failure is a WARNING
        (the local result stands).
        """
        if not self.writable:
            log.warning(
                "%s: computed entry %s locally; the remote cache %s is read-only, nothing uploaded",
                entry.stage,
                entry.key[:12],
                self.url,
            )
            return
        try:
            for f in entry.outputs:
                remote = self.blob_path(f.digest)
                if f.digest not in self._bad and self._has(remote, f.size):
                    continue
                # only verified bytes (a record by reference: assembled, verified as it is)
                with store.materialized(f) as local:
                    self._put_file(local, remote)
            data = json.dumps(entry.to_json(), sort_keys=True, indent=1).encode("utf-8")
            self._put_bytes(data, self.action_path(entry.key))
        except Exception as e:
            log.warning(
                "remote cache %s: could not upload %s entry %s (%s: %s); kept locally only",
                self.url,
                entry.stage,
                entry.key[:12],
                type(e).__name__,
                e,
            )
            return
        log.info("%s: uploaded entry %s to the remote cache", entry.stage, entry.key[:12])

    def deps_path(self, declared: str) -> str:
        return f"{self.root}/deps/{declared[:2]}/{declared}.json"

    def deps_sets(self, declared: str) -> list[Any]:
        """The remote's dependency sets of ``declared`` (unvalidated dicts; may be empty)."""
        return self._read_deps(declared)

    def _read_deps(self, declared: str) -> list[Any]:
        try:
            raw = self._read_bounded(self.deps_path(declared), MAX_RECORD_BYTES)
            if len(raw) > MAX_RECORD_BYTES:
                raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
            data = json.loads(raw)
        except FileNotFoundError:
            return []
        except Exception as e:
            log.warning("remote cache %s: cannot read dependency record (%s)", self.url, e)
            return []
        sets = data.get("sets") if isinstance(data, dict) else None
        if not isinstance(sets, list) or data.get("format") != DEPS_FORMAT:
            log.warning("remote cache %s: ignoring a dependency record of unknown format", self.url)
            return []
        return [d for d in sets if _plausible_set(d)]

    def fetch_deps(self, declared: str, local: Path) -> bool:
        """Merge the remote's dependency sets of ``declared`` into the local record ``local``.

        Returns whether any set was added (the caller then resolves again).
        """
        remote_sets = self._read_deps(declared)
        if not remote_sets:
            return False
        local_sets = _read_local_deps(local)
        merged = _merge(local_sets, remote_sets)
        if len(merged) == len(local_sets):
            return False
        atomic_write_canonical_json(local, {"format": DEPS_FORMAT, "sets": merged})
        return True

    def upload_deps(self, declared: str, local: Path) -> None:
        """Merge the local dependency sets of ``declared`` into the remote record (after the
        entry they lead to was uploaded). A no-op in ``read_only`` mode; failures are WARNINGs."""
        if not self.writable:
            return
        try:
            merged = _merge(_read_local_deps(local), self._read_deps(declared))
            data = json.dumps({"format": DEPS_FORMAT, "sets": merged}, sort_keys=True, indent=1)
            self._put_bytes(data.encode("utf-8"), self.deps_path(declared))
        except Exception as e:
            log.warning(
                "remote cache %s: could not upload the dependency record %s (%s: %s)",
                self.url,
                declared[:12],
                type(e).__name__,
                e,
            )

    def _read_bounded(self, path: str, limit: int) -> bytes:
        """At most ``limit + 1`` bytes of ``path`` (one more than allowed shows it is over)."""
        with self.fs.open(path, "rb") as src:
            data: bytes = src.read(limit + 1)
        return data

    def _download(self, path: str, target: Path, size: int) -> int:
        """Copy ``path`` to ``target``, reading at most ``size + 1`` bytes; returns how many
        were read (over ``size``: the object is not what its entry declares)."""
        read = 0
        with self.fs.open(path, "rb") as src, open(target, "wb") as dst:
            while read <= size:
                chunk = src.read(min(_CHUNK, size + 1 - read))
                if not chunk:
                    break
                dst.write(chunk)
                read += len(chunk)
        return read

    def _has(self, path: str, size: int) -> bool:
        try:
            return int(self.fs.size(path)) == size
        except FileNotFoundError:
            return False

    def has_blob(self, digest: str, size: int) -> bool:
        """Whether blob ``digest`` is on the remote with ``size`` bytes."""
        return self._has(self.blob_path(digest), size)

    def _put_file(self, local: Path, remote: str) -> None:
        """Stream ``local`` to ``remote`` (multipart where the filesystem does it), atomically."""
        if self._atomic_put:
            self.fs.put_file(str(local), remote)
            return
        tmp = f"{remote}.{secrets.token_hex(4)}.tmp"
        self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        try:
            self.fs.put_file(str(local), tmp)
            self.fs.mv(tmp, remote)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)
            raise

    def _put_bytes(self, data: bytes, remote: str) -> None:
        if self._atomic_put:
            self.fs.pipe_file(remote, data)
            return
        tmp = f"{remote}.{secrets.token_hex(4)}.tmp"
        self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, remote)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)
            raise


def _read_local_deps(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    sets = data.get("sets") if isinstance(data, dict) else None
    return [d for d in sets if _plausible_set(d)] if isinstance(sets, list) else []


def _plausible_set(deps: Any) -> bool:
    """The shape of a dependency set (``discovered.py`` validates its contents on use)."""
    return (
        isinstance(deps, dict)
        and isinstance(deps.get("modules"), dict)
        and isinstance(deps.get("dists"), dict)
    )


def _merge(first: list[Any], second: list[Any]) -> list[Any]:
    """``first`` then the sets of ``second`` it lacks, at most ``MAX_SETS``."""
    seen = {set_digest(d) for d in first}
    merged = list(first)
    for deps in second:
        if set_digest(deps) not in seen:
            seen.add(set_digest(deps))
            merged.append(deps)
    return merged[:MAX_SETS]


def remote_from_settings(
    url: str | None, mode: str, storage_options: Mapping[str, Any]
) -> Remote | None:
    """The remote tier at ``url`` (None when unset), in ``mode``."""
    if not url:
        return None
    return Remote(url, mode=mode, storage_options=storage_options)

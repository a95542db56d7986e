"""Verify a cache: re-hash every blob (a blob recorded by reference: assembled from its sources); drop corrupt blobs and every entry that names a missing or
corrupt blob (dangling), lacks an output its stage declares (incomplete), or cannot be read, so
that no later lookup trusts them.

What a stage declares is computed from the stage's code (``Stage.outputs``) for the params the
entry recorded when it was committed, never read from a list the entry holds: editing an
entry's files cannot make it look complete. An entry of a stage the caller's pipeline does not
have, or whose params the stage cannot read, is dropped: no build of that pipeline would use it.

Everything else is left alone: a blob no entry names is not corrupt (the collector removes it),
and a build running meanwhile only adds complete blobs (written under a temporary name, then
renamed) and entries whose blobs already exist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .hashing import sha256_file
from .inventory import EntryInfo, scan
from .sourced import SourcesError, digest_of
from .stage import Stage
from .store import CacheStore

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    """What :func:`verify` found.

    Attributes:
        blobs: Number of blobs re-hashed.
        blob_bytes: Their bytes.
        entries: Number of entries checked.
        problems: One line per corrupt blob or dropped entry.
        corrupt_blobs: Blobs whose content did not match their name (removed).
        dropped_entries: Entries removed.
    """

    blobs: int = 0
    blob_bytes: int = 0
    entries: int = 0
    problems: list[str] = field(default_factory=list)
    corrupt_blobs: int = 0
    dropped_entries: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(store: CacheStore, stages: Sequence[Stage]) -> VerifyResult:
    """Re-hash every blob of ``store``, then check every entry against what is left, and
    against the outputs its stage (one of ``stages``, by name) declares for the entry's params."""
    by_name = {stage.name: stage for stage in stages}
    result = VerifyResult()
    for digest, path in store.blob_paths():
        try:
            actual = sha256_file(path)
            size = path.stat().st_size
        except FileNotFoundError:  # removed by a concurrent collection
            continue
        result.blobs += 1
        result.blob_bytes += size
        if actual != digest:
            result.corrupt_blobs += 1
            result.problems.append(f"blob {digest[:12]}: corrupt (content hashes to {actual[:12]})")
            path.unlink(missing_ok=True)
    for digest, path in store.ref_paths():
        result.blobs += 1
        problem = _unassembled(store, digest)
        if problem:
            result.corrupt_blobs += 1
            result.problems.append(f"blob {digest[:12]} (by reference): {problem}")
            path.unlink(missing_ok=True)
    inventory = scan(store)
    for key, reason, path in inventory.unreadable:
        result.entries += 1
        result.dropped_entries += 1
        result.problems.append(f"entry {key[:12]}: dropped, unreadable ({reason})")
        path.unlink(missing_ok=True)
    for info in inventory.entries:
        result.entries += 1
        problem = _incomplete(info, by_name) or _dangling(info, store)
        if problem:
            result.dropped_entries += 1
            what = f"{info.stage}, {', '.join(info.builds) or 'build unknown'}"
            result.problems.append(f"entry {info.key[:12]} ({what}): dropped, {problem}")
            info.path.unlink(missing_ok=True)
    return result


def _incomplete(info: EntryInfo, stages: Mapping[str, Stage]) -> str:
    """Why ``info``'s entry is not complete for its stage (empty: it is)."""
    stage = stages.get(info.stage)
    if stage is None:
        return f"stage {info.stage!r} is not one of this pipeline's ({', '.join(stages)})"
    try:
        declared = stage.outputs(info.entry.params)
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # data, not a valid slice
        return f"its params do not declare outputs ({type(e).__name__}: {e})"
    lacking = info.entry.missing(declared)
    return f"incomplete (lacks {', '.join(lacking)})" if lacking else ""


def _unassembled(store: CacheStore, digest: str) -> str:
    """Why the record of blob ``digest`` by reference does not give its bytes (empty: it does)."""
    sources = store.sources_of(digest)
    if sources is None:
        return "its record is unreadable"
    try:
        actual = digest_of(sources, store.resolve_source)
    except (OSError, SourcesError) as e:
        return f"a source cannot be read ({e})"
    return "" if actual == digest else f"its sources now hash to {actual[:12]}"


def _dangling(info: EntryInfo, store: CacheStore) -> str:
    """Why an output blob of ``info``'s entry is unusable (empty: none is)."""
    for f in info.entry.outputs:
        blob = store.blob_path(f.digest)
        try:
            size = blob.stat().st_size
        except FileNotFoundError:
            if store.has_blob(f):  # recorded by reference, assembled above
                continue
            return f"blob of {f.path} is missing"
        if size != f.size:
            return f"blob of {f.path} has {size} bytes, not {f.size}"
    return ""

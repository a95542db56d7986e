"""``cache verify``: re-hash every blob; drop corrupt blobs and every entry that names a missing or
corrupt blob (dangling), lacks an output its stage declares (incomplete), or cannot be read, so
that no later lookup trusts them.

Everything else is left alone: a blob no entry names is not corrupt (``cache gc`` removes it),
and a build running meanwhile only adds complete blobs (written under a temporary name, then
renamed) and entries whose blobs already exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from hyperexport.cli.cache_inventory import scan
from hyperexport.engine.hashing import sha256_file
from hyperexport.engine.store import CacheStore

log = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    """What ``cache verify`` found.

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


def verify(store: CacheStore) -> VerifyResult:
    """Re-hash every blob of ``store``, then check every entry against what is left, and
    against the outputs its stage declared (recorded in the entry)."""
    result = VerifyResult()
    for digest, path in store.blob_paths():
        try:
            actual = sha256_file(path)
            size = path.stat().st_size
        except FileNotFoundError:  # removed by a concurrent gc
            continue
        result.blobs += 1
        result.blob_bytes += size
        if actual != digest:
            result.corrupt_blobs += 1
            result.problems.append(f"blob {digest[:12]}: corrupt (content hashes to {actual[:12]})")
            path.unlink(missing_ok=True)
    inventory = scan(store)
    for key, reason, path in inventory.unreadable:
        result.entries += 1
        result.dropped_entries += 1
        result.problems.append(f"entry {key[:12]}: dropped, unreadable ({reason})")
        path.unlink(missing_ok=True)
    for info in inventory.entries:
        result.entries += 1
        lacking = info.entry.missing()
        if lacking:
            result.dropped_entries += 1
            what = f"{info.stage}, {', '.join(info.recipes) or 'recipe unknown'}"
            result.problems.append(
                f"entry {info.key[:12]} ({what}): dropped, incomplete (lacks {', '.join(lacking)})"
            )
            info.path.unlink(missing_ok=True)
            continue
        for f in info.entry.outputs:
            blob = store.blob_path(f.digest)
            try:
                size = blob.stat().st_size
            except FileNotFoundError:
                problem = "is missing"
            else:
                problem = "" if size == f.size else f"has {size} bytes, not {f.size}"
            if problem:
                result.dropped_entries += 1
                what = f"{info.stage}, {', '.join(info.recipes) or 'recipe unknown'}"
                result.problems.append(
                    f"entry {info.key[:12]} ({what}): dropped, blob of {f.path} {problem}"
                )
                info.path.unlink(missing_ok=True)
                break
    return result

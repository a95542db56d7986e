"""Push and pull: seed a remote tier from a local cache, or fill a local cache from a remote,
with the remote tier's own transfer functions (``remote.py``).

* :func:`push` uploads every given local entry the remote lacks (blobs first, the entry last);
  an entry already on the remote with all its blobs is skipped. Each uploaded entry is read
  back and its blobs' sizes checked. :func:`push_dependencies` then merges the discovered-
  dependency records.
* :func:`pull` downloads every remote entry the local cache lacks; each blob is checked against
  its digest before it is moved in (a mismatch is a WARNING and the entry is skipped).
  :func:`pull_dependencies` merges the records.

Both are idempotent (a second run transfers nothing) and report each entry as they go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .entries import ActionEntry
from .inventory import scan
from .remote import Remote
from .store import HIT, CacheStore

#: What happened to one entry: moved, there already, or failed (a WARNING says why).
MOVED, PRESENT, FAILED = "moved", "present", "failed"


@dataclass(frozen=True)
class Transfer:
    """One entry pushed or pulled.

    Attributes:
        key: Its key.
        outcome: :data:`MOVED`, :data:`PRESENT` or :data:`FAILED`.
        entry: The entry, where known (a pulled entry is read only when builds are chosen).
    """

    key: str
    outcome: str
    entry: ActionEntry | None = None


def local_keys(store: CacheStore, builds: Iterable[str] = ()) -> list[str]:
    """The keys of ``store``'s entries, those computed or used by one of ``builds`` (all when
    empty), sorted."""
    wanted = set(builds)
    return sorted(e.key for e in scan(store).entries if not wanted or wanted & set(e.builds))


def remote_keys(remote: Remote) -> list[str]:
    """The keys of the remote's entries, sorted."""
    try:
        paths = remote.fs.find(f"{remote.root}/actions")
    except FileNotFoundError:
        return []
    return sorted(Path(p).name[: -len(".json")] for p in paths if p.endswith(".json"))


def on_remote(remote: Remote, entry: ActionEntry) -> bool:
    """Whether ``entry`` and every blob it names (by size) are on the remote."""
    found = remote.read_entry(entry.key)
    return found is not None and all(remote.has_blob(f.digest, f.size) for f in entry.outputs)


def push(store: CacheStore, remote: Remote, keys: Iterable[str]) -> Iterator[Transfer]:
    """Upload the entries ``keys`` of ``store`` that the remote lacks, one by one."""
    for key in keys:
        entry = store.read_entry(key)
        if on_remote(remote, entry):
            yield Transfer(key, PRESENT, entry)
            continue
        remote.upload(entry, store)
        yield Transfer(key, MOVED if on_remote(remote, entry) else FAILED, entry)


def push_dependencies(store: CacheStore, remote: Remote) -> int:
    """Merge every local dependency record into the remote's; returns how many."""
    records = sorted((store.root / "deps").glob("*/*.json"))
    for path in records:
        remote.upload_deps(path.stem, path)
    return len(records)


def pull(
    store: CacheStore, remote: Remote, keys: Iterable[str], builds: Iterable[str] = ()
) -> Iterator[Transfer]:
    """Download the entries ``keys`` of the remote that ``store`` lacks, one by one: those
    computed by one of ``builds`` (all when empty; others are skipped silently)."""
    wanted = set(builds)
    for key in keys:
        if store.lookup(key).status == HIT:  # a store without a remote: local only
            yield Transfer(key, PRESENT)
            continue
        entry = None
        if wanted:
            entry = remote.read_entry(key)
            if entry is None or entry.build not in wanted:
                continue
        yield Transfer(key, MOVED if remote.fetch(key, store) else FAILED, entry)


def pull_dependencies(store: CacheStore, remote: Remote) -> int:
    """Merge every dependency record of the remote into the local ones; returns how many."""
    try:
        records = [p for p in remote.fs.find(f"{remote.root}/deps") if p.endswith(".json")]
    except FileNotFoundError:
        records = []
    for path in records:
        declared = Path(path).name[: -len(".json")]
        remote.fetch_deps(declared, store.root / "deps" / declared[:2] / f"{declared}.json")
    store.save_index()
    return len(records)

"""``cache push`` and ``cache pull``: seed a remote tier from a local cache, or fill a local
cache from a remote, with the remote tier's own transfer functions (``engine/remote.py``).

* ``push`` uploads every local entry the remote lacks (blobs first, the entry last), then the
  discovered-dependency records; an entry already on the remote with all its blobs is skipped.
  Each uploaded entry is read back and its blobs' sizes checked.
* ``pull`` downloads every remote entry the local cache lacks; each blob is checked against its
  digest before it is moved in (a mismatch is a WARNING and the entry is skipped).
* ``--recipe NAME`` limits both to the entries that recipe computed or used.

Both are idempotent (a second run transfers nothing) and report progress per entry.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path

from hyperexport import exit_codes
from hyperexport.cli.usage import UsageError
from hyperexport.engine.entries import ActionEntry
from hyperexport.engine.remote import Remote
from hyperexport.engine.store import HIT, CacheStore
from hyperexport.progress import track

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``cache push`` / ``cache pull``."""
    parser.add_argument("remote", metavar="URL", help="the remote tier (s3://bucket/prefix, ...)")
    parser.add_argument(
        "--recipe",
        action="append",
        default=[],
        metavar="NAME",
        help="only the entries this recipe computed or used (repeatable; default: all)",
    )
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec option of the remote (endpoint_url=http://..., anon=true)",
    )


def _options(items: Iterable[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {item!r}: must be KEY=VALUE")
        lowered = value.lower()
        out[key] = True if lowered == "true" else False if lowered == "false" else value
    if "endpoint_url" in out:  # s3fs takes it inside client_kwargs
        out.setdefault("client_kwargs", {"endpoint_url": out.pop("endpoint_url")})
    return out


def _remote(args: argparse.Namespace, mode: str) -> Remote:
    return Remote(args.remote, mode=mode, storage_options=_options(args.storage_option))


def _local_keys(store: CacheStore, recipes: list[str]) -> list[str]:
    from hyperexport.cli.cache_inventory import scan

    inventory = scan(store)
    return sorted(e.key for e in inventory.entries if not recipes or set(recipes) & set(e.recipes))


def _remote_keys(remote: Remote) -> list[str]:
    try:
        paths = remote.fs.find(f"{remote.root}/actions")
    except FileNotFoundError:
        return []
    return sorted(Path(p).name[: -len(".json")] for p in paths if p.endswith(".json"))


def _on_remote(remote: Remote, entry: ActionEntry) -> bool:
    """Whether ``entry`` and every blob it names (by size) are on the remote."""
    found = remote.read_entry(entry.key)
    return found is not None and all(
        remote._has(remote.blob_path(f.digest), f.size) for f in entry.outputs
    )


def cmd_push(args: argparse.Namespace, root: Path) -> int:
    """Upload the local entries (and dependency records) the remote lacks."""
    store = CacheStore(root, read_only=True)
    remote = _remote(args, "read_write")
    keys = _local_keys(store, args.recipe)
    sent = skipped = failed = 0
    for key in track(keys, f"pushing to {args.remote}", unit="entries"):
        entry = store.read_entry(key)
        if _on_remote(remote, entry):
            skipped += 1
            continue
        remote.upload(entry, store)
        if _on_remote(remote, entry):
            sent += 1
            print(f"pushed {entry.stage} {key[:12]} ({len(entry.outputs)} files)", flush=True)
        else:
            failed += 1
            print(f"FAILED {entry.stage} {key[:12]} (see the WARNING above)", flush=True)
    deps = sorted((root / "deps").glob("*/*.json"))
    for path in deps:
        remote.upload_deps(path.stem, path)
    print(
        f"{sent} pushed, {skipped} already there, {failed} failed; "
        f"{len(deps)} dependency records merged; {args.remote}"
    )
    return exit_codes.FAILED if failed else exit_codes.OK


def cmd_pull(args: argparse.Namespace, root: Path) -> int:
    """Download the remote entries (and dependency records) the local cache lacks."""
    store = CacheStore(root)
    remote = _remote(args, "read_only")
    fetched = present = failed = 0
    for key in track(_remote_keys(remote), f"pulling from {args.remote}", unit="entries"):
        if store.lookup(key).status == HIT:  # this store has no remote: local only
            present += 1
            continue
        if args.recipe:
            entry = remote.read_entry(key)
            if entry is None or entry.recipe not in args.recipe:
                continue
        if remote.fetch(key, store):
            fetched += 1
            print(f"pulled {key[:12]}", flush=True)
        else:
            failed += 1
            print(f"FAILED {key[:12]} (see the WARNING above)", flush=True)
    try:
        deps = [p for p in remote.fs.find(f"{remote.root}/deps") if p.endswith(".json")]
    except FileNotFoundError:
        deps = []
    for path in deps:
        declared = Path(path).name[: -len(".json")]
        remote.fetch_deps(declared, root / "deps" / declared[:2] / f"{declared}.json")
    store.save_index()
    print(
        f"{fetched} pulled, {present} already here, {failed} failed; "
        f"{len(deps)} dependency records merged; cache {root}"
    )
    return exit_codes.FAILED if failed else exit_codes.OK

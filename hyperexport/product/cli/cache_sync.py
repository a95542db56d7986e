"""``cache push`` and ``cache pull``: the arguments, and a line per entry; the transfers are the
engine's (``engine/sync.py``).

* ``push`` uploads every local entry the remote lacks, then the discovered-dependency records.
* ``pull`` downloads every remote entry the local cache lacks, then the records.
* ``--recipe NAME`` limits both to the entries that recipe computed or used.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path

from hyperexport.base import exit_codes
from hyperexport.engine import sync
from hyperexport.engine.remote import Remote
from hyperexport.engine.settings import READ_ONLY, READ_WRITE
from hyperexport.engine.store import CacheStore
from hyperexport.library.progress import track
from hyperexport.product.cli.usage import UsageError

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


def cmd_push(args: argparse.Namespace, root: Path) -> int:
    """Upload the local entries (and dependency records) the remote lacks."""
    store = CacheStore(root, read_only=True)
    remote = _remote(args, READ_WRITE)
    keys = track(sync.local_keys(store, args.recipe), f"pushing to {args.remote}", unit="entries")
    counts = {sync.MOVED: 0, sync.PRESENT: 0, sync.FAILED: 0}
    for moved in sync.push(store, remote, keys):
        counts[moved.outcome] += 1
        assert moved.entry is not None
        what = f"{moved.entry.stage} {moved.key[:12]}"
        if moved.outcome == sync.MOVED:
            print(f"pushed {what} ({len(moved.entry.outputs)} files)", flush=True)
        elif moved.outcome == sync.FAILED:
            print(f"FAILED {what} (see the WARNING above)", flush=True)
    records = sync.push_dependencies(store, remote)
    print(
        f"{counts[sync.MOVED]} pushed, {counts[sync.PRESENT]} already there, "
        f"{counts[sync.FAILED]} failed; {records} dependency records merged; {args.remote}"
    )
    return exit_codes.FAILED if counts[sync.FAILED] else exit_codes.OK


def cmd_pull(args: argparse.Namespace, root: Path) -> int:
    """Download the remote entries (and dependency records) the local cache lacks."""
    store = CacheStore(root)
    remote = _remote(args, READ_ONLY)
    keys = track(sync.remote_keys(remote), f"pulling from {args.remote}", unit="entries")
    counts = {sync.MOVED: 0, sync.PRESENT: 0, sync.FAILED: 0}
    for moved in sync.pull(store, remote, keys, args.recipe):
        counts[moved.outcome] += 1
        if moved.outcome == sync.MOVED:
            print(f"pulled {moved.key[:12]}", flush=True)
        elif moved.outcome == sync.FAILED:
            print(f"FAILED {moved.key[:12]} (see the WARNING above)", flush=True)
    records = sync.pull_dependencies(store, remote)
    print(
        f"{counts[sync.MOVED]} pulled, {counts[sync.PRESENT]} already here, "
        f"{counts[sync.FAILED]} failed; {records} dependency records merged; cache {root}"
    )
    return exit_codes.FAILED if counts[sync.FAILED] else exit_codes.OK

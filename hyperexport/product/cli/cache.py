"""``python -m hyperexport cache <command>``: inspect and manage the build cache and outputs.

Commands (each prints plain text, one line per entry, for logs)::

    status [RECIPE ...] [--recipe-file PATH] [--override KEY=VALUE]   what a build would run, why
    status --lock                                                     which locked variants would rebuild
    ls [--stage NAME] [--recipe NAME]                                 entries, least recently used first
    show KEY                                                          one entry (a unique key prefix is enough)
    verify                                                            re-hash every blob, drop corrupt entries
    gc [--max-size SIZE] [--older-than AGE] [--grace AGE] [--dry-run] LRU eviction and garbage removal
    clean [RECIPE[/VARIANT] ...] [--outputs-dir DIR] [--yes]          remove outputs of recipes that are gone
    push URL [--recipe NAME] [--storage-option K=V]                   seed a remote from this cache
    pull URL [--recipe NAME] [--storage-option K=V]                   fill this cache from a remote

Every command but ``clean`` takes ``--cache-dir DIR`` (default: ``$HYPEREXPORT_CACHE_DIR``, else
``~/.cache/hyperexport``, as the build). Exit codes (:mod:`hyperexport.base.exit_codes`): 0 done;
1 ``verify`` found corruption (it was dropped), ``push``/``pull`` failed to transfer an entry, or ``status --lock`` found hyperexport.lock stale; 2 invalid arguments, an unknown or ambiguous key,
or (``status``) an invalid recipe; 3 the cache or outputs directory cannot be used.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import NoReturn

from hyperexport.base import exit_codes
from hyperexport.base.cache_dir import default_cache_dir
from hyperexport.base.errors import CacheUnavailableError
from hyperexport.base.sizes import human_size
from hyperexport.engine.store import CacheStore
from hyperexport.product.cli.quantities import human_age, parse_age, parse_size
from hyperexport.product.cli.table import render_table
from hyperexport.product.cli.usage import UnusableDirectory, UsageError, check_dir

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and an exit code, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _age(text: str) -> float:
    try:
        return parse_age(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    """The ``cache`` argument parser (subcommands with their options)."""
    common = _Parser(add_help=False)
    common.add_argument("--cache-dir", type=Path, help="the cache (default: as the build)")
    parser = _Parser(
        prog="hyperexport cache", description="Inspect and manage the hyperexport build cache."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    status = sub.add_parser("status", parents=[common], help="what a build would run, and why")
    status.add_argument(
        "recipes", nargs="*", metavar="RECIPE", help="recipes/ names (default: all)"
    )
    status.add_argument(
        "--recipe-file",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="a recipe kept outside recipes/ (repeatable)",
    )
    status.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="a recipe override"
    )
    status.add_argument(
        "--lock",
        action="store_true",
        help="compare with hyperexport.lock instead: which locked variants would rebuild, "
        "and why (exit 1 when the lock is stale); builds nothing",
    )

    ls = sub.add_parser("ls", parents=[common], help="entries, least recently used first")
    ls.add_argument("--stage", help="only entries of this stage")
    ls.add_argument("--recipe", help="only entries this recipe used")

    show = sub.add_parser("show", parents=[common], help="one entry")
    show.add_argument("key", metavar="KEY", help="a key or a unique prefix of one")

    sub.add_parser("verify", parents=[common], help="re-hash blobs, drop corrupt entries")

    gc = sub.add_parser("gc", parents=[common], help="evict least recently used entries")
    gc.add_argument("--max-size", type=_size, metavar="SIZE", help="e.g. 500M, 2G")
    gc.add_argument("--older-than", type=_age, metavar="AGE", help="e.g. 7d, 12h")
    gc.add_argument(
        "--grace",
        type=_age,
        default=None,
        metavar="AGE",
        help="never evict what was used more recently than this (default 1h)",
    )
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")

    from hyperexport.product.cli.cache_sync import add_arguments as add_sync_arguments

    push = sub.add_parser("push", parents=[common], help="upload local entries to a remote")
    add_sync_arguments(push)
    pull = sub.add_parser("pull", parents=[common], help="download remote entries into the cache")
    add_sync_arguments(pull)

    from hyperexport.product.cli.clean_outputs import add_arguments as add_clean_arguments

    clean = sub.add_parser("clean", help="remove outputs of recipes that are gone")
    add_clean_arguments(clean)
    clean.set_defaults(cache_dir=None)
    return parser


def main(argv: list[str]) -> int:
    """Run one ``cache`` command; returns the exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(message)s")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return exit_codes.INVALID
    except SystemExit as e:  # --help
        return int(e.code or 0)
    root = default_cache_dir(args.cache_dir)
    try:
        if args.command != "clean":
            check_dir(root, "cache", writable=args.command in ("verify", "gc", "pull"))
        return int(COMMANDS[args.command](args, root))
    except UsageError as e:
        print(f"hyperexport cache {args.command}: {e}", file=sys.stderr)
        return exit_codes.INVALID
    except (UnusableDirectory, OSError, CacheUnavailableError) as e:
        print(f"hyperexport cache {args.command}: {e}", file=sys.stderr)
        return exit_codes.UNAVAILABLE


def _when(epoch: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))
    return f"{stamp} UTC ({human_age(now - epoch)} ago)"


# -- commands ------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.product.cli.cache_status import plan_recipe, repository_recipes

    if args.lock:
        from hyperexport.product.cli.lock_command import status_lock

        return status_lock()
    known = repository_recipes()
    for name in args.recipes:
        if name not in known:
            from hyperexport.base.errors import did_you_mean

            raise UsageError(f"no recipe {name!r} in recipes/{did_you_mean(name, known)}")
    for file in args.recipe_file:
        if not file.is_file():
            raise UsageError(f"--recipe-file {file}: no such file")
    names = args.recipes or ([] if args.recipe_file else known)
    plans = [plan_recipe(root, recipe=n, overrides=args.override) for n in names]
    plans += [
        plan_recipe(root, recipe_file=f.resolve(), overrides=args.override)
        for f in args.recipe_file
    ]
    rows = []
    for p in plans:
        if p.error is not None:
            rows.append([p.recipe, "-", "invalid", p.error])
        for s in p.stages:
            status = "would run" if s.status == "would_run" else s.status
            rows.append([p.recipe, s.name, status, s.reason])
    for line in render_table(["RECIPE", "STAGE", "STATUS", "REASON"], rows):
        print(line)
    fresh = sum(p.up_to_date for p in plans)
    invalid = sum(p.error is not None for p in plans)
    print(f"{fresh} of {len(plans)} recipes up to date, {invalid} invalid; cache {root}")
    return exit_codes.INVALID if invalid else exit_codes.OK


def cmd_ls(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.engine.inventory import disk_usage, scan

    inventory = scan(CacheStore(root, read_only=True))
    now = time.time()
    shown = [
        e
        for e in inventory.entries
        if (args.stage is None or e.stage == args.stage)
        and (args.recipe is None or args.recipe in e.builds)
    ]
    rows = [
        [
            e.key[:12],
            e.stage,
            ",".join(e.builds) or "-",
            human_size(e.size),
            _when(e.last_used, now),
        ]
        for e in shown
    ]
    for line in render_table(["KEY", "STAGE", "RECIPE", "SIZE", "LAST USE"], rows):
        print(line)
    for key, reason, _path in inventory.unreadable:
        print(f"unreadable entry {key[:12]}: {reason}")
    print(
        f"{len(shown)} of {len(inventory.entries)} entries, "
        f"{human_size(sum(e.size for e in shown))} of outputs; "
        f"cache {root}: {human_size(disk_usage(root))} on disk"
    )
    return exit_codes.OK


def cmd_show(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.engine.inventory import AmbiguousKey, find, scan

    store = CacheStore(root, read_only=True)
    try:
        info = find(scan(store).entries, args.key)
    except AmbiguousKey as e:
        raise UsageError(str(e)) from e
    except KeyError as e:
        raise UsageError(f"no cache entry has a key starting with {args.key!r}") from e
    now = time.time()
    for line in render_table(
        ["FIELD", "VALUE"],
        [
            ["key", info.key],
            ["stage", info.stage],
            ["recipe", ", ".join(info.builds) or "-"],
            ["size", f"{human_size(info.size)} in {len(info.entry.outputs)} files"],
            ["last use", _when(info.last_used, now)],
            ["entry", str(info.path)],
        ],
    )[1:]:
        print(line)
    rows = []
    for f in info.entry.outputs:
        present = store.has_blob(f)
        rows.append(
            [f.path, human_size(f.size), f.digest[:12], "present" if present else "MISSING"]
        )
    for line in render_table(["OUTPUT", "SIZE", "DIGEST", "BLOB"], rows):
        print(line)
    return exit_codes.OK


def cmd_verify(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.engine.verify import verify
    from hyperexport.product.stages.pipeline import PIPELINE

    result = verify(CacheStore(root), PIPELINE)
    for line in result.problems:
        print(line)
    print(
        f"verified {result.blobs} blobs ({human_size(result.blob_bytes)}) and "
        f"{result.entries} entries: {result.corrupt_blobs} corrupt blobs removed, "
        f"{result.dropped_entries} entries dropped; cache {root}"
    )
    return exit_codes.OK if result.ok else exit_codes.FAILED


def cmd_gc(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.engine.collector import DEFAULT_GRACE, GcOptions, collect

    options = GcOptions(
        max_size=args.max_size,
        older_than=args.older_than,
        grace=DEFAULT_GRACE if args.grace is None else args.grace,
        dry_run=args.dry_run,
    )
    result = collect(CacheStore(root), options)
    verb = "would evict" if options.dry_run else "evicted"
    now = time.time()
    rows = [
        [
            verb,
            e.key[:12],
            e.stage,
            ",".join(e.builds) or "-",
            human_size(e.size),
            _when(e.last_used, now),
        ]
        for e in result.evicted
    ]
    for line in render_table(["ACTION", "KEY", "STAGE", "RECIPE", "SIZE", "LAST USE"], rows)[1:]:
        print(line)
    bound = f" (bound {human_size(options.max_size)})" if options.max_size is not None else ""
    print(
        f"gc: {verb} {len(result.evicted)} entries; "
        f"{'would remove' if options.dry_run else 'removed'} {result.blobs} blobs "
        f"({human_size(result.blob_bytes)}), {result.records} dependency records "
        f"({human_size(result.record_bytes)}), {len(result.unreadable)} unreadable entries and "
        f"{result.temp_files} stale temporary files, {result.scratch} scratch folders of dead "
        f"builds ({human_size(result.scratch_bytes)}); cache {root}: "
        f"{human_size(result.size_before)} -> {human_size(result.size_after)}{bound}"
    )
    if result.kept_recent:
        print(
            f"kept {result.kept_recent} entries used within the grace period "
            f"({human_age(options.grace)}, --grace)"
        )
    if options.max_size is not None and result.size_after > options.max_size:
        print(f"the cache is still above {human_size(options.max_size)}")
    return exit_codes.OK


def cmd_clean(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.product.cli.clean_outputs import run_clean

    return run_clean(args)


def cmd_push(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.product.cli import cache_sync

    return cache_sync.cmd_push(args, root)


def cmd_pull(args: argparse.Namespace, root: Path) -> int:
    from hyperexport.product.cli import cache_sync

    return cache_sync.cmd_pull(args, root)


COMMANDS = {
    "status": cmd_status,
    "ls": cmd_ls,
    "show": cmd_show,
    "verify": cmd_verify,
    "gc": cmd_gc,
    "clean": cmd_clean,
    "push": cmd_push,
    "pull": cmd_pull,
}

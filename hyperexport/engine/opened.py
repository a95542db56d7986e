"""Files the model opens while it is built and traced: discovered like ccache's headers.

Python raises an audit event for every file it opens (``open``: built-in ``open``, ``io``,
``os.open``, ``pathlib``) and for every shared library ``ctypes`` loads (``ctypes.dlopen``).
One audit hook (:func:`sys.addaudithook`: it cannot be removed, so it is installed once per
process and does nothing outside :func:`recording`) collects, per thread, the files opened
while a stage that runs the model runs. The runner keys the regular files among them that were
read by content, beside the modules that were loaded (:mod:`.discovered`).

Not keyed:

* what the stage wrote itself: a file it opened for writing, or whose status changed after the
  recording began (created or rewritten by the stage, native code included: an exporter
  writing a file, then reading it back). That is the build's own scratch space;
* what native code opens without an audit event: a native library reading a checkpoint, the
  dynamic linker loading a library's dependencies. Files the caller keys by content already
  (a checkpoint, files the model's arguments name) are excluded; anything else native code
  reads must be declared;
* ``/proc``, ``/dev``, ``/sys``, ``__pycache__``, and the paths the caller excludes (the cache,
  the outputs, the files keyed already).

A file in the temporary directory is keyed like any other: a model that reads
``/tmp/x/gain.json`` depends on it (an earlier design left the temporary directory out, and a
changed ``gain.json`` was then a cache hit on every machine).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

_SYSTEM_PREFIXES = ("/proc/", "/dev/", "/sys/")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_lock = threading.Lock()
_active: list[tuple[int, Reads]] = []
_installed = False


@dataclass
class Reads:
    """What the stages that run the model opened in one build.

    Attributes:
        read: Paths opened for reading, or loaded with ``ctypes`` (absolute as given).
        written: Paths opened for writing.
        since_ns: When the first recording began (``time.time_ns()``); a file whose status
            changed later is the build's own.
    """

    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    since_ns: int | None = None


def _opened_path(event: str, args: tuple[Any, ...]) -> tuple[str, bool] | None:
    """``(path, for writing)`` of an ``open`` or a ``ctypes.dlopen``, else None."""
    writing = False
    if event == "open":
        path, mode, flags = (*args, None, None, None)[:3]
        if isinstance(mode, str):
            writing = any(c in mode for c in "wax+")
        elif isinstance(flags, int):
            writing = bool(flags & _WRITE_FLAGS)
    elif event == "ctypes.dlopen":
        path = args[0] if args else None
    else:
        return None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path:
        return None
    return path, writing


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event not in ("open", "ctypes.dlopen"):
        return
    found = _opened_path(event, args)
    if found is None:
        return
    path, writing = found
    thread = threading.get_ident()
    with _lock:
        for owner, reads in _active:
            if owner == thread:
                where = reads.written if writing else reads.read
                where.add(os.path.abspath(path) if os.sep in path else path)


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


@contextlib.contextmanager
def recording(reads: Reads) -> Iterator[Reads]:
    """Collect into ``reads`` the paths this thread opens inside the block; other threads (a
    remote tier's I/O loop, a server in a test) are not the model.

    Paths are absolute as given (not resolved); a ``dlopen`` of a bare library name
    (``libm.so.6``, found by the dynamic linker) is kept as that name and dropped by
    :func:`regular_files`.
    """
    _install()
    if reads.since_ns is None:
        reads.since_ns = time.time_ns()
    entry = (threading.get_ident(), reads)
    with _lock:
        _active.append(entry)
    try:
        yield reads
    finally:
        with _lock:
            _active.remove(entry)


def regular_files(reads: Reads, exclude: tuple[str, ...] = ()) -> list[str]:
    """The regular files the stages read and did not write themselves, resolved, outside the
    excluded places, sorted.

    Args:
        reads: What :func:`recording` collected.
        exclude: Folders (or files) whose content is keyed otherwise or that are the build's
            own (the cache, the outputs, the checkpoint).
    """
    excluded = tuple(os.path.realpath(e) for e in exclude)
    prefixes = tuple(p.rstrip(os.sep) + os.sep for p in excluded) + _SYSTEM_PREFIXES
    exact = set(excluded) | {os.path.realpath(p) for p in reads.written if os.path.isabs(p)}
    found = set()
    resolve = _resolver()
    for path in reads.read:
        if not os.path.isabs(path) or path.startswith(_SYSTEM_PREFIXES):
            continue
        real = resolve(path)
        if (
            real in exact
            or (real + os.sep).startswith(prefixes)
            or "__pycache__" in real.split(os.sep)
            or not os.path.isfile(real)
            or _changed_since(real, reads.since_ns)
        ):
            continue
        found.add(real)
    return sorted(found)


def _resolver() -> Callable[[str], str]:
    """``os.path.realpath`` for many files in few folders: each folder is resolved once, then
    only a file's last part can still be a link (one ``lstat``, where ``realpath`` takes one per
    part of the path). A build reads thousands of module files from a few hundred folders."""
    folders: dict[str, str] = {}

    def resolve(path: str) -> str:
        head, tail = os.path.split(path)
        if tail in ("", ".", ".."):
            return os.path.realpath(path)
        folder = folders.get(head)
        if folder is None:
            folder = folders[head] = os.path.realpath(head)
        joined = os.path.join(folder, tail)
        return os.path.realpath(joined) if os.path.islink(joined) else joined

    return resolve


def _changed_since(path: str, since_ns: int | None) -> bool:
    """Whether ``path``'s status changed at or after ``since_ns``: the stage made it."""
    if since_ns is None:
        return False
    try:
        return os.stat(path).st_ctime_ns >= since_ns
    except OSError:
        return True

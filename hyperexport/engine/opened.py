"""Files the model opens while it is built and traced: discovered like ccache's headers.

Python raises an audit event for every file it opens (``open``: built-in ``open``, ``io``,
``os.open``, ``pathlib``) and for every shared library ``ctypes`` loads (``ctypes.dlopen``).
One audit hook (:func:`sys.addaudithook`: it cannot be removed, so it is installed once per
process and does nothing outside :func:`recording`) collects the regular files opened for
reading while a stage that runs the model runs. The runner keys them by content, beside the
modules that were loaded (:mod:`hyperexport.engine.discovered`).

Not collected:

* what native code opens without an audit event: safetensors and tokenizers reading a
  checkpoint, the dynamic linker loading a library's dependencies. A checkpoint and every
  file or folder a ``model:`` argument names are keyed by content already; anything else native
  code reads must be declared;
* ``/proc``, ``/dev``, ``/sys``, the temporary directory, ``__pycache__``, and the paths the
  caller excludes (the cache, the outputs, the files keyed already);
* files opened for writing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

_SYSTEM_PREFIXES = ("/proc/", "/dev/", "/sys/")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_lock = threading.Lock()
_active: list[tuple[int, set[str]]] = []
_installed = False


def _opened_path(event: str, args: tuple[Any, ...]) -> str | None:
    """The path a read-only ``open`` or a ``ctypes.dlopen`` names, else None."""
    if event == "open":
        path, mode, flags = (*args, None, None, None)[:3]
        if isinstance(mode, str):
            if any(c in mode for c in "wax+"):
                return None
        elif isinstance(flags, int) and flags & _WRITE_FLAGS:
            return None
    elif event == "ctypes.dlopen":
        path = args[0] if args else None
    else:
        return None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or not path:
        return None
    return path


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event not in ("open", "ctypes.dlopen"):
        return
    path = _opened_path(event, args)
    if path is None:
        return
    thread = threading.get_ident()
    with _lock:
        for owner, sink in _active:
            if owner == thread:
                sink.add(os.path.abspath(path) if os.sep in path else path)


def _install() -> None:
    global _installed
    with _lock:
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True


@contextlib.contextmanager
def recording(sink: set[str]) -> Iterator[set[str]]:
    """Collect into ``sink`` the paths this thread opens for reading (or dlopens) inside the
    block; other threads (a remote tier's I/O loop, a server in a test) are not the model.

    Paths are absolute as given (not resolved); a ``dlopen`` of a bare library name
    (``libm.so.6``, found by the dynamic linker) is kept as that name and dropped by
    :func:`regular_files`.
    """
    _install()
    entry = (threading.get_ident(), sink)
    with _lock:
        _active.append(entry)
    try:
        yield sink
    finally:
        with _lock:
            _active.remove(entry)


def _excluded_prefixes(extra: tuple[str, ...]) -> tuple[str, ...]:
    temp = os.path.realpath(tempfile.gettempdir())
    return tuple(p.rstrip(os.sep) + os.sep for p in (*extra, temp)) + _SYSTEM_PREFIXES


def regular_files(paths: set[str], exclude: tuple[str, ...] = ()) -> list[str]:
    """The regular files among ``paths``, resolved, outside the excluded places, sorted.

    Args:
        paths: What :func:`recording` collected.
        exclude: Folders (or files) whose content is keyed otherwise or that are the build's
            own (the cache, the outputs, the checkpoint).
    """
    prefixes = _excluded_prefixes(tuple(os.path.realpath(e) for e in exclude))
    exact = {os.path.realpath(e) for e in exclude}
    found = set()
    for path in paths:
        if not os.path.isabs(path) or path.startswith(_SYSTEM_PREFIXES):
            continue
        real = os.path.realpath(path)
        if (
            real in exact
            or (real + os.sep).startswith(prefixes)
            or "__pycache__" in real.split(os.sep)
            or not os.path.isfile(real)
        ):
            continue
        found.add(real)
    return sorted(found)

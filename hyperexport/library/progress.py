"""Progress of long steps (units exported, functions checked, bytes written), one call per site.

On a terminal, a live bar (rich) on stderr that disappears when the step ends; elsewhere (logs,
CI, Hydra multirun workers, pytest) a plain INFO line at most every :data:`PERIOD` seconds, and
nothing at all for a step that finishes sooner, so short builds log exactly what they did before.
``HYPEREXPORT_PROGRESS=bar|lines|off`` overrides the choice.

A step over layers of a large model can show the process's anonymous memory beside the count
(``memory=True``: ``RssAnon`` plus swap, what a streamed build bounds).

Usage::

    for job in progress.track(jobs, "exporting units", unit="units", memory=True): ...
    with progress.counting("tracing layers", total=32, unit="layers") as update: update(done)
    with progress.watch_bytes(out_dir, "writing model"): save(...)
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import Any, TypeVar

from hyperexport.base.sizes import human_size
from hyperexport.library.meminfo import anonymous_memory

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two plain progress lines (and before the first one).
PERIOD = 10.0

#: How often a byte watcher looks at the files, in seconds.
POLL = 0.5

_MODES = ("bar", "lines", "off")


def mode() -> str:
    """``bar`` on a terminal, else ``lines``; ``HYPEREXPORT_PROGRESS`` overrides."""
    chosen = os.environ.get("HYPEREXPORT_PROGRESS", "").strip().lower()
    if chosen in _MODES:
        return chosen
    if chosen:
        log.warning("HYPEREXPORT_PROGRESS=%r is not one of %s; ignoring it", chosen, _MODES)
    return "bar" if sys.stderr.isatty() else "lines"


class _Lines:
    """Plain progress lines: one at most every PERIOD seconds, none for a short step."""

    def __init__(
        self,
        label: str,
        total: float | None,
        unit: str,
        clock: Callable[[], float],
        memory: bool = False,
    ):
        self.label, self.total, self.unit, self.clock = label, total, unit, clock
        self.memory = memory
        self.started = self.last = clock()
        self.done = 0.0
        self.printed = False

    def update(self, done: float) -> None:
        self.done = done
        now = self.clock()
        if now - self.last >= PERIOD:
            self.last = now
            self.printed = True
            log.info("%s: %s (%.0fs)", self.label, self._amount(), now - self.started)

    def close(self) -> None:
        if self.printed:  # a long step also says when it ended
            log.info(
                "%s: %s, done in %.1fs", self.label, self._amount(), self.clock() - self.started
            )

    def _amount(self) -> str:
        done = _human(self.done, self.unit)
        if self.total:
            done = (
                f"{done} of {_human(self.total, self.unit)} ({100 * self.done / self.total:.0f}%)"
            )
        return done + _memory_note(self.memory)


def _memory_note(memory: bool) -> str:
    """``", 1.2 GiB anonymous"`` when ``memory`` and the system reports it, else ``""``."""
    used = anonymous_memory() if memory else None
    return "" if used is None else f", {_human(used, 'bytes')} anonymous"


def _human(value: float, unit: str) -> str:
    if unit != "bytes":
        return f"{int(value)} {unit}".strip()
    return human_size(int(value))


class _Bar:
    """A rich progress bar on stderr; several at once share one live display."""

    _lock = threading.Lock()
    _progress: Any = None
    _users = 0

    def __init__(self, label: str, total: float | None, unit: str, memory: bool = False) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        with _Bar._lock:
            if _Bar._progress is None:
                from rich.console import Console

                amount = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
                _Bar._progress = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    amount,
                    TimeElapsedColumn(),
                    console=Console(stderr=True),
                    transient=True,
                )
                _Bar._progress.start()
            _Bar._users += 1
            self.progress = _Bar._progress
            self.task = self.progress.add_task(label, total=total)
        self.label, self.memory = label, memory

    def update(self, done: float) -> None:
        note = _memory_note(self.memory)  # in the description: one column set serves every bar
        self.progress.update(self.task, completed=done, description=self.label + note)

    def close(self) -> None:
        with _Bar._lock:
            self.progress.remove_task(self.task)
            _Bar._users -= 1
            if _Bar._users == 0:
                self.progress.stop()
                _Bar._progress = None


class _Off:
    def update(self, done: float) -> None:
        pass

    def close(self) -> None:
        pass


def _reporter(
    label: str, total: float | None, unit: str, memory: bool = False
) -> _Lines | _Bar | _Off:
    chosen = mode()
    if chosen == "bar":
        return _Bar(label, total, unit, memory)
    if chosen == "lines":
        return _Lines(label, total, unit, time.monotonic, memory)
    return _Off()


@contextlib.contextmanager
def counting(
    label: str, *, unit: str = "items", total: float | None = None, memory: bool = False
) -> Iterator[Callable[[float], None]]:
    """Report a count that the body advances by calling what this yields with the count done
    (for steps that are no loop of their own: hooks, callbacks).

    Args:
        label: What is being done (``"tracing layers"``).
        unit: What is counted (``"layers"``).
        total: The count at the end, when known.
        memory: Show the process's anonymous memory beside the count.
    """
    reporter = _reporter(label, total, unit, memory)
    try:
        yield reporter.update
    finally:
        reporter.close()


def track(
    items: Iterable[T],
    label: str,
    *,
    unit: str = "items",
    total: int | None = None,
    memory: bool = False,
) -> Iterator[T]:
    """Yield ``items``, reporting how many have been processed.

    Args:
        items: What the loop goes over.
        label: What is being done (``"exporting units"``).
        unit: What an item is (``"units"``).
        total: The number of items, when ``items`` has no ``len``.
        memory: Show the process's anonymous memory beside the count.
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    with counting(label, unit=unit, total=total, memory=memory) as update:
        for done, item in enumerate(items, start=1):
            yield item
            update(done)


def _size(directory: Path) -> int:
    """Bytes of the regular files under ``directory`` (a symlink wrote nothing: not counted)."""
    total = 0
    for path in directory.rglob("*"):
        try:
            st = path.lstat()
        except FileNotFoundError:  # a temp file moved into place meanwhile: counted there
            continue
        total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


@contextlib.contextmanager
def watch_bytes(directory: Path, label: str) -> Iterator[None]:
    """Report the bytes under ``directory`` while the body writes there (polled on a thread)."""
    directory = Path(directory)
    reporter = _reporter(label, None, "bytes")
    stop = threading.Event()
    start = _size(directory) if directory.is_dir() else 0

    def poll() -> None:
        while not stop.wait(POLL):
            reporter.update(max(0, _size(directory) - start) if directory.is_dir() else 0)

    thread = threading.Thread(target=poll, name="hyperexport-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        reporter.update(max(0, _size(directory) - start) if directory.is_dir() else 0)
        reporter.close()

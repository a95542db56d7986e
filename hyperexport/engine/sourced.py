"""Blobs by reference: a large output whose bytes are ranges of files that stay on disk.

A stage that writes a large file by copying ranges of a file the build already depends on (a
model's weights, copied from the checkpoint they were loaded from) may declare so
(:class:`FileSources`). The cache then stores, instead of a second copy of those bytes, a small
record of where they are (``blobs/<aa>/<digest>.ref``): the file's size, and for each range its
offset, its length, the source file and the offset there. Bytes outside every range are zeros
(the alignment padding between tensors).

The record is data. A checkout assembles the file from the sources and hashes it as it writes,
so a source that changed, moved or vanished is a digest mismatch: the record is removed and the
entry misses, as a corrupt blob would. A commit checks the declaration against the file the
stage wrote, byte for byte, before it records anything; a declaration that does not hold is a
WARNING and the file is copied in as usual. What a record saves is the write of the copy: the
build keeps the stage's own file for its later stages (``workspace.py``), so the bytes are on
disk once beside their source instead of twice.

A record is only as durable as its sources: a remote cache always receives real bytes
(assembled and verified on upload), and ``cache verify`` assembles every record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: The record's format; another is unreadable (the blob misses).
SOURCES_FORMAT = 1
#: Suffix of a record in the blob store, after the digest.
REF_SUFFIX = ".ref"
_CHUNK = 8 << 20


class SourcesError(ValueError):
    """A sources record is malformed, or does not describe the file it is for."""


@dataclass(frozen=True)
class Piece:
    """Bytes ``[offset, offset + length)`` of the file are those of ``source`` at ``source_offset``."""

    offset: int
    length: int
    source: str
    source_offset: int

    def __post_init__(self) -> None:
        if min(self.offset, self.length, self.source_offset) < 0:
            raise SourcesError(f"negative range in {self}")
        if not os.path.isabs(self.source):
            raise SourcesError(f"source {self.source!r} is not an absolute path")


@dataclass(frozen=True)
class FileSources:
    """Where a file's bytes are: ``pieces`` (sorted, disjoint, inside ``size``); zeros elsewhere."""

    size: int
    pieces: tuple[Piece, ...]

    def __post_init__(self) -> None:
        end = 0
        for p in self.pieces:
            if p.offset < end:
                raise SourcesError(f"pieces overlap or are unsorted at offset {p.offset}")
            end = p.offset + p.length
        if end > self.size:
            raise SourcesError(f"a piece ends at {end}, past the file's {self.size} bytes")

    @property
    def covered(self) -> int:
        """Bytes the pieces cover (the rest is zeros)."""
        return sum(p.length for p in self.pieces)

    def to_json(self) -> dict[str, Any]:
        sources = sorted({p.source for p in self.pieces})
        index = {s: i for i, s in enumerate(sources)}
        return {
            "format": SOURCES_FORMAT,
            "size": self.size,
            "sources": sources,
            "pieces": [[p.offset, p.length, index[p.source], p.source_offset] for p in self.pieces],
        }

    @classmethod
    def from_json(cls, data: Any) -> FileSources:
        """Raises :class:`SourcesError` for anything but a well-formed record."""
        try:
            if data["format"] != SOURCES_FORMAT:
                raise SourcesError(f"sources format {data['format']!r}, not {SOURCES_FORMAT}")
            sources = [str(s) for s in data["sources"]]
            pieces = tuple(
                Piece(int(o), int(n), sources[int(i)], int(so)) for o, n, i, so in data["pieces"]
            )
            return cls(int(data["size"]), pieces)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            if isinstance(e, SourcesError):
                raise
            raise SourcesError(f"bad sources record ({type(e).__name__}: {e})") from e

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> FileSources:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise SourcesError(f"bad sources record ({e})") from e
        return cls.from_json(data)


def _segments(sources: FileSources) -> Iterator[tuple[int, Piece | None]]:
    """``(length, piece or None for zeros)`` covering the file in order."""
    at = 0
    for p in sources.pieces:
        if p.offset > at:
            yield p.offset - at, None
        yield p.length, p
        at = p.offset + p.length
    if sources.size > at:
        yield sources.size - at, None


def _open_regular(path: str) -> IO[bytes]:
    """``path`` opened for reading, if it is a regular file (a record is data: never a device, a
    pipe or a directory, whatever a cache on disk says)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SourcesError(f"source {path} is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _chunks(sources: FileSources) -> Iterator[bytes | memoryview]:
    """The file's bytes, in chunks, read from the sources.

    Raises:
        OSError: A source cannot be read.
        SourcesError: A source is shorter than its piece says.
    """
    handles: dict[str, IO[bytes]] = {}
    zeros = bytes(_CHUNK)
    with contextlib.ExitStack() as stack:
        for length, piece in _segments(sources):
            if piece is None:
                while length:
                    n = min(length, _CHUNK)
                    yield memoryview(zeros)[:n]
                    length -= n
                continue
            fh = handles.get(piece.source)
            if fh is None:
                fh = handles[piece.source] = stack.enter_context(_open_regular(piece.source))
            fh.seek(piece.source_offset)
            while length:
                data = fh.read(min(length, _CHUNK))
                if not data:
                    raise SourcesError(f"source {piece.source} ends before its piece does")
                yield data
                length -= len(data)


def assemble(sources: FileSources, target: IO[bytes]) -> str:
    """Write the file ``sources`` describes to ``target``; return the sha256 of what was written.

    Raises:
        OSError: A source cannot be read.
        SourcesError: A source is shorter than its piece says.
    """
    h = hashlib.sha256()
    for chunk in _chunks(sources):
        h.update(chunk)
        target.write(chunk)
    return h.hexdigest()


def digest_of(sources: FileSources) -> str:
    """The sha256 of the file ``sources`` describes, read from the sources (nothing written)."""
    h = hashlib.sha256()
    for chunk in _chunks(sources):
        h.update(chunk)
    return h.hexdigest()


def matching_digest(path: Path, sources: FileSources) -> str | None:
    """The sha256 of ``path`` if its bytes are exactly what ``sources`` describes, else None.

    One read of ``path`` (hashed as it is compared) and one of the covered ranges.

    Raises:
        OSError: ``path`` or a source cannot be read.
    """
    if path.stat().st_size != sources.size:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        try:
            for expected in _chunks(sources):
                got = fh.read(len(expected))
                if got != expected:
                    return None
                h.update(got)
        except SourcesError:
            return None
    return h.hexdigest()


def merged(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    """``pieces`` sorted, adjacent ones of one source joined into one (fewer, longer reads)."""
    out: list[Piece] = []
    for p in sorted(pieces, key=lambda p: p.offset):
        last = out[-1] if out else None
        if (
            last is not None
            and last.source == p.source
            and last.offset + last.length == p.offset
            and last.source_offset + last.length == p.source_offset
        ):
            out[-1] = Piece(last.offset, last.length + p.length, p.source, last.source_offset)
        else:
            out.append(p)
    return tuple(out)

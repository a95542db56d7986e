"""Blobs by reference: a large output whose bytes are ranges of files that stay on disk.

A stage that writes a large file by copying ranges of a file the build already depends on (a
model's weights, copied from the checkpoint they were loaded from) may declare so
(:class:`FileSources`). The cache then stores, instead of a second copy of those bytes, a small
record of where they are (``blobs/<aa>/<digest>.ref``): the file's size, and for each range its
offset, its length, the source file and the offset there. Bytes outside every range are zeros
(the alignment padding between tensors). A record may also hold a few bytes itself (literal
pieces, at most :data:`LITERAL_MAX`), and a range may come from a blob of the same store
(:func:`blob_source`): so a stage that copies one of its inputs and appends a little (a pass's
new constants after the export's weights) declares the copy as its input's range plus the
tail. The store resolves a range of an input it holds by reference through that input's own
record, so records never chain.

The record is data. A checkout assembles the file from the sources and hashes it as it writes,
so a source that changed, moved or vanished is a digest mismatch: the record is removed and the
entry misses, as a corrupt blob would. A commit checks the declaration against the file the
stage wrote, byte for byte, before it records anything, unless the declaration carries the
file's digest from a writer that compared every range as it copied it (``FileSources.digest``:
then the size is checked and nothing read); a declaration that does not hold is a WARNING and
the file is copied in as usual. What a record saves is the write of the copy: the
build keeps the stage's own file for its later stages (``workspace.py``), so the bytes are on
disk once beside their source instead of twice.

A record is only as durable as its sources: a remote cache always receives real bytes
(assembled and verified on upload), and ``cache verify`` assembles every record.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .hashing import SHA256_HEX

#: The record's format; another is unreadable (the blob misses).
SOURCES_FORMAT = 1
#: Suffix of a record in the blob store, after the digest.
REF_SUFFIX = ".ref"
_CHUNK = 8 << 20


class SourcesError(ValueError):
    """A sources record is malformed, or does not describe the file it is for."""


#: A source that is a blob of the same store, by digest (``blob:<sha256>``): what a piece of a
#: stage's output names when it copies an input the cache holds as a blob. Resolved by the
#: store; kept symbolic so that a record survives the cache folder's move.
BLOB_SOURCE = "blob:"
#: Bytes a record may hold itself (literal pieces): what passes add to a copied file.
LITERAL_MAX = 1 << 20
_BLOB_SOURCE = re.compile(rf"{BLOB_SOURCE}[0-9a-f]{{64}}")


def blob_source(digest: str) -> str:
    """The source name of blob ``digest`` of the same store."""
    return f"{BLOB_SOURCE}{digest}"


def blob_digest(source: str) -> str | None:
    """The digest a ``blob:`` source names, else None."""
    return source.removeprefix(BLOB_SOURCE) if _BLOB_SOURCE.fullmatch(source) else None


@dataclass(frozen=True)
class Piece:
    """Bytes ``[offset, offset + length)`` of the file are those of ``source`` at
    ``source_offset`` (an absolute path, or a blob of the store: :func:`blob_source`), or, for a
    literal piece (:meth:`literal`), ``data`` itself."""

    offset: int
    length: int
    source: str
    source_offset: int
    data: bytes | None = None

    def __post_init__(self) -> None:
        if min(self.offset, self.length, self.source_offset) < 0:
            raise SourcesError(f"negative range in {self}")
        if self.data is not None:
            if self.source or len(self.data) != self.length:
                raise SourcesError(f"literal piece at {self.offset}: not {self.length} bytes")
        elif not (os.path.isabs(self.source) or blob_digest(self.source)):
            raise SourcesError(f"source {self.source!r} is not an absolute path or a blob")

    @classmethod
    def literal(cls, offset: int, data: bytes) -> Piece:
        """A piece whose bytes the record holds."""
        return cls(offset, len(data), "", 0, bytes(data))

    def within(self, start: int, end: int, at: int) -> Piece | None:
        """The part of this piece over ``[start, end)`` of its file, moved so that ``start``
        falls at ``at`` (None when they do not overlap)."""
        lo, hi = max(start, self.offset), min(end, self.offset + self.length)
        if lo >= hi:
            return None
        skip, where = lo - self.offset, at + lo - start
        if self.data is not None:
            return Piece.literal(where, self.data[skip : skip + hi - lo])
        return Piece(where, hi - lo, self.source, self.source_offset + skip)


@dataclass(frozen=True)
class FileSources:
    """Where a file's bytes are: ``pieces`` (sorted, disjoint, inside ``size``); zeros elsewhere.

    ``digest``, in a stage's declaration only (never in a record): the file's sha256, from a
    writer that hashed every byte it wrote and compared every range with its source as it
    copied it (``library/export/hashed_writer.py``). The commit then takes the file as
    described without reading it again.
    """

    size: int
    pieces: tuple[Piece, ...]
    digest: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.digest is not None and not SHA256_HEX.fullmatch(self.digest):
            raise SourcesError(f"digest {self.digest!r} is not a sha256 in hex")
        end = 0
        for p in self.pieces:
            if p.offset < end:
                raise SourcesError(f"pieces overlap or are unsorted at offset {p.offset}")
            end = p.offset + p.length
        if end > self.size:
            raise SourcesError(f"a piece ends at {end}, past the file's {self.size} bytes")
        held = sum(p.length for p in self.pieces if p.data is not None)
        if held > LITERAL_MAX:
            raise SourcesError(f"{held} literal bytes, over the {LITERAL_MAX} a record may hold")

    @property
    def covered(self) -> int:
        """Bytes the pieces cover (the rest is zeros)."""
        return sum(p.length for p in self.pieces)

    def blobs(self) -> set[str]:
        """The digests of the store's blobs this record reads."""
        return {d for p in self.pieces if (d := blob_digest(p.source)) is not None}

    def through(self, piece: Piece) -> list[Piece]:
        """The pieces of ``piece``, a copy of a range of the file this record describes: that
        range mapped through the record (its zeros stay uncovered)."""
        start, end = piece.source_offset, piece.source_offset + piece.length
        found = (p.within(start, end, piece.offset) for p in self.pieces)
        return [p for p in found if p is not None]

    def to_json(self) -> dict[str, Any]:
        sources = sorted({p.source for p in self.pieces if p.data is None})
        index = {s: i for i, s in enumerate(sources)}
        return {
            "format": SOURCES_FORMAT,
            "size": self.size,
            "sources": sources,
            "pieces": [
                [p.offset, base64.b64encode(p.data).decode("ascii")]
                if p.data is not None
                else [p.offset, p.length, index[p.source], p.source_offset]
                for p in self.pieces
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> FileSources:
        """Raises :class:`SourcesError` for anything but a well-formed record."""
        try:
            if data["format"] != SOURCES_FORMAT:
                raise SourcesError(f"sources format {data['format']!r}, not {SOURCES_FORMAT}")
            sources = [str(s) for s in data["sources"]]
            pieces = tuple(
                Piece.literal(int(p[0]), base64.b64decode(p[1], validate=True))
                if len(p) == 2
                else Piece(int(p[0]), int(p[1]), sources[int(p[2])], int(p[3]))
                for p in data["pieces"]
            )
            return cls(int(data["size"]), pieces)
        except SourcesError:
            raise
        except (KeyError, TypeError, IndexError, ValueError, binascii.Error) as e:
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


#: Maps a piece's source to the file to read (the store resolves ``blob:`` sources).
Resolver = Callable[[str], str]


def _as_path(source: str) -> str:
    if blob_digest(source) is not None:
        raise SourcesError(f"source {source} names a blob, and no store resolves it here")
    return source


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


def _chunks(sources: FileSources, resolve: Resolver = _as_path) -> Iterator[bytes | memoryview]:
    """The file's bytes, in chunks, read from the sources.

    Raises:
        OSError: A source cannot be read.
        SourcesError: A source is shorter than its piece says, or is not a regular file.
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
            if piece.data is not None:
                yield piece.data
                continue
            fh = handles.get(piece.source)
            if fh is None:
                path = resolve(piece.source)
                fh = handles[piece.source] = stack.enter_context(_open_regular(path))
            fh.seek(piece.source_offset)
            while length:
                data = fh.read(min(length, _CHUNK))
                if not data:
                    raise SourcesError(f"source {piece.source} ends before its piece does")
                yield data
                length -= len(data)


def assemble(sources: FileSources, target: IO[bytes], resolve: Resolver = _as_path) -> str:
    """Write the file ``sources`` describes to ``target``; return the sha256 of what was written.

    Raises:
        OSError: A source cannot be read.
        SourcesError: A source is shorter than its piece says.
    """
    h = hashlib.sha256()
    for chunk in _chunks(sources, resolve):
        h.update(chunk)
        target.write(chunk)
    return h.hexdigest()


def digest_of(sources: FileSources, resolve: Resolver = _as_path) -> str:
    """The sha256 of the file ``sources`` describes, read from the sources (nothing written)."""
    h = hashlib.sha256()
    for chunk in _chunks(sources, resolve):
        h.update(chunk)
    return h.hexdigest()


def matching_digest(path: Path, sources: FileSources, resolve: Resolver = _as_path) -> str | None:
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
            for expected in _chunks(sources, resolve):
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
            and last.data is None
            and p.data is None
            and last.source == p.source
            and last.offset + last.length == p.offset
            and last.source_offset + last.length == p.source_offset
        ):
            out[-1] = Piece(last.offset, last.length + p.length, p.source, last.source_offset)
        else:
            out.append(p)
    return tuple(out)

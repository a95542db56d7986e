"""A build's checkouts: upstream outputs as files for the stages that read them, large ones once.

On a filesystem without reflinks (ext4, tmpfs) every checkout of a blob is a full copy, and a
large data file may be read by several stages (one stage's output weights are the next
stage's input, then the one after reads the same bytes again under another name). Links do
not help there: the readers of such files may refuse a data file that is a symlink, has
several hard links, or leaves its model's folder (the product's ARCHITECTURE names the ones
measured). The data must be a regular file, with one name, in the folder of its reader.

So a :class:`Workspace` holds **one** regular copy of each large blob per build
(:data:`ONE_COPY_MIN` bytes or more), verified against its digest when it is copied out:

* a large file a stage of this build wrote is kept as that copy when it is committed
  (:meth:`adopt`, through :meth:`CacheStore.commit`'s ``keep``): the commit copies it into the
  blob store, hashing it as it copies, so the next stage's checkout moves it instead of copying
  the blob back out and hashing it again;
* a later checkout of the same digest *moves* that copy to its new place and leaves a relative
  symlink at the old one (stages run one at a time, and the stage about to run reads the new
  place; the old one stays readable as a file);
* a stage output that is a symlink to a file of the workspace (an input a stage passes on
  unchanged, under another name) is committed under that file's digest
  without reading or copying it (:meth:`digest_of`, used by :meth:`CacheStore.commit`);
* after the build, publishing takes the copy (:meth:`hand_over`): moved into the publication
  instead of copied from the blob again.

A copy's stat (device, inode, size, mtime, ctime) is recorded after every operation on it; one
that changed since (a stage wrote to its input) is no longer trusted: it is left where it is and
the next use copies the blob afresh (a WARNING). Small files are plain verified copies.

So a build whose data file is unchanged by the passes writes the weights twice in all: once from
the model (the export's file, kept as the build's copy) and once into the cache (its blob, a copy
hashed as it is written), or once when the stage declared where its bytes are (a blob by
reference, ``sourced.py``: the cache records the ranges instead of the copy); the kept copy is moved to the next stage's checkout and, at the end,
into the publication. The cache, its scratch and the outputs never hold more than those two (a
previous publication being replaced aside: it stays until the link swaps). Measured on a 2 GB
file here (ext4, no reflinks): a copy hashed on the way costs what the plain copy costs, and the
old order (move in, copy out, hash the copy) read the file once more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .entries import ActionEntry, OutputFile
from .stage import matches
from .store import CacheStore

log = logging.getLogger(__name__)

#: Blobs at least this large are held once per build (moved between checkouts, handed over to
#: publishing); smaller ones are copied for every checkout.
ONE_COPY_MIN = 1 << 20
_READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def _stat_key(path: Path) -> tuple[int, ...] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class _Copy:
    """A verified regular file of the workspace: its digest, and its stat when last handled."""

    path: Path
    digest: str
    stat: tuple[int, ...] | None

    def unchanged(self) -> bool:
        return self.stat is not None and _stat_key(self.path) == self.stat


class Workspace:
    """The checkouts of one build attempt, in one scratch folder (``<cache>/tmp/build-*``).

    The folder is made on the first checkout and removed by :meth:`close` (a context manager
    closes it too), so a build of cache hits creates nothing.

    Args:
        store: The cache the blobs come from.
    """

    def __init__(self, store: CacheStore) -> None:
        self.store = store
        self._stack = contextlib.ExitStack()
        self._root: Path | None = None
        self._dirs: dict[str, Path] = {}
        self._files: dict[str, _Copy] = {}  # real path -> every verified file checked out
        self._held: dict[str, str] = {}  # digest -> real path of its one large copy
        self._placed: dict[str, set[str]] = {}  # checkout name -> the files placed in it
        self._released: dict[str, str] = {}  # real path -> digest of a copy a stage took over

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the folder and everything still in it."""
        self._files.clear()
        self._held.clear()
        self._dirs.clear()
        self._placed.clear()
        self._released.clear()
        self._root = None
        self._stack.close()

    def checkout(
        self, name: str, entry: ActionEntry, patterns: tuple[str, ...] | None = None
    ) -> Path:
        """The folder holding ``entry``'s files, checked out once per build under ``name``:
        those matching the glob ``patterns`` (every file when None). A later checkout of
        ``name`` with other patterns adds the files it wants to the same folder.

        Raises:
            CorruptBlobError: A blob is missing or does not match its digest (it has been
                removed, so a new lookup of its entry misses).
        """
        dest = self._dirs.get(name) or self._folder() / name
        placed = self._placed.setdefault(name, set())
        for f in entry.outputs:
            if f.path in placed:
                continue
            if not matches(f.path, patterns):
                continue
            self._place(f, dest / f.path)
            placed.add(f.path)
        dest.mkdir(parents=True, exist_ok=True)  # an entry may have no files
        self._dirs[name] = dest
        return dest

    def _folder(self) -> Path:
        if self._root is None:
            self._root = self._stack.enter_context(self.store.scratch("build-"))
        return self._root

    def wants(self, size: int) -> bool:
        """Whether a committed file of ``size`` bytes should be kept (:meth:`adopt`)."""
        return size >= ONE_COPY_MIN

    def adopt(self, path: Path, digest: str) -> None:
        """Keep ``path`` (a stage's output whose bytes have ``digest``) as this build's copy.

        It is moved out of the stage's scratch into this workspace, read-only; a later checkout
        of ``digest`` moves it to its place. When a trusted copy of ``digest`` is already held,
        ``path`` is left for the scratch folder's removal.
        """
        if self._trusted(digest) is not None:
            return
        kept = self._folder() / ".kept" / f"{digest[:16]}.{secrets.token_hex(4)}"
        kept.parent.mkdir(exist_ok=True)
        os.replace(path, kept)
        os.chmod(kept, _READ_ONLY)
        real = os.path.realpath(kept)
        self._files[real] = _Copy(Path(real), digest, _stat_key(kept))
        self._held[digest] = real

    def _place(self, f: OutputFile, target: Path) -> None:
        large = f.size >= ONE_COPY_MIN
        if large and self._move_held(f.digest, target):
            return
        self.store.copy_blob(f, target)  # verified against its digest
        if large:
            os.chmod(target, _READ_ONLY)
        real = os.path.realpath(target)
        self._files[real] = _Copy(Path(real), f.digest, _stat_key(target))
        if large:
            self._held[f.digest] = real

    def _move_held(self, digest: str, target: Path) -> bool:
        """Move the held copy of ``digest`` to ``target``, a symlink to it left behind."""
        held = self._trusted(digest)
        if held is None:
            return False
        old = held.path
        target.parent.mkdir(parents=True, exist_ok=True)
        link = old.parent / f".{old.name}.{secrets.token_hex(4)}.link"
        os.symlink(os.path.relpath(target, old.parent), link)
        try:
            os.replace(old, target)
        except BaseException:
            link.unlink()
            raise
        os.replace(link, old)
        del self._files[str(old)]
        real = os.path.realpath(target)
        self._files[real] = _Copy(Path(real), digest, _stat_key(target))
        self._held[digest] = real
        log.debug("moved the build's copy of %s to %s", digest[:12], target)
        return True

    def _trusted(self, digest: str) -> _Copy | None:
        """The held copy of ``digest`` if it is unchanged; a changed one is let go."""
        real = self._held.get(digest)
        if real is None:
            return None
        copy = self._files[real]
        if copy.unchanged():
            return copy
        log.warning(
            "%s changed after it was checked out (a stage wrote to its input); copying the "
            "cached blob afresh for later uses",
            copy.path,
        )
        del self._held[digest]
        del self._files[real]
        return None

    def digest_of(self, path: Path) -> str | None:
        """The digest of the file ``path`` resolves to, if this workspace checked it out and
        verified it and it is unchanged since; else None."""
        copy = self._files.get(os.path.realpath(path))
        return copy.digest if copy is not None and copy.unchanged() else None

    def release(self, path: Path) -> bool:
        """Give the held copy at ``path`` up to the stage that checked it out (it will move or
        change it): False when ``path`` is not a held, unchanged copy. The file is made
        writable; :meth:`input_digest` still names its digest, and a later checkout of that
        digest copies the blob."""
        real = os.path.realpath(path)
        copy = self._files.get(real)
        if copy is None or self._held.get(copy.digest) != real or not copy.unchanged():
            return False
        del self._held[copy.digest]
        del self._files[real]
        self._released[real] = copy.digest
        os.chmod(real, 0o644)
        log.debug("a stage took over the build's copy of %s at %s", copy.digest[:12], real)
        return True

    def names_of(self, path: Path) -> list[tuple[str, str]]:
        """``(checkout name, relative path)`` of every checked-out file that is ``path`` (its
        own place, and the symlinks a move left at earlier checkouts of the same bytes)."""
        real = os.path.realpath(path)
        return [
            (name, rel)
            for name, placed in self._placed.items()
            for rel in sorted(placed)
            if os.path.realpath(self._dirs[name] / rel) == real
        ]

    def input_digest(self, path: Path) -> str | None:
        """The digest of the checked-out input ``path``: as :meth:`digest_of`, or of a copy a
        stage took over (:meth:`release`), whatever became of the file since."""
        return self.digest_of(path) or self._released.get(os.path.realpath(path))

    def hand_over(self, digest: str, target: Path) -> bool:
        """Move the held copy of ``digest`` to ``target`` (mode 0644) for publishing.

        Returns False when there is none, or it changed, or cannot be moved there (another
        filesystem: the copy is then removed, so that the caller's copy from the blob does not
        make a third one); the caller copies from the blob.
        """
        held = self._trusted(digest)
        if held is None:
            return False
        del self._held[digest]
        del self._files[str(held.path)]
        try:
            os.replace(held.path, target)
        except OSError as e:  # the outputs are on another filesystem than the cache
            log.warning(
                "cannot move the build's copy of %s (%.2f GB) to %s (%s); copying it from the "
                "cache instead",
                target.name,
                held.stat[2] / 1e9 if held.stat else 0.0,
                target.parent,
                e.strerror or e,
            )
            held.path.unlink(missing_ok=True)
            return False
        os.chmod(target, 0o644)
        return True

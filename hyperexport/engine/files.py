"""Writing files so that no reader sees half of one, and cloning them cheaply.

* Atomic writes: a temporary file in the same directory, then ``os.replace``. A reader (or a
  crashed run) never sees a half-written file.
* :func:`clone_or_copy`: a reflink where the filesystem allows (XFS, Btrfs), a plain copy
  otherwise. Checkouts of cached files and published outputs are clones of the cache's blobs,
  so a filesystem with reflinks stores a file once. Hard links are never used: a hard-linked
  output edited in place would corrupt the cache, and some readers refuse a file with more
  than one link. Nor symlinks, for files a consumer may refuse to follow.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_reflink_failed_once = False


def atomic_write_with(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then move it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write_with(path, lambda fh: fh.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def clone_or_copy(src: Path, dst: Path) -> str:
    """Write ``dst`` as a reflink of ``src`` when possible, else as a copy.

    ``dst`` must not exist (callers write to a temporary name and rename). Returns ``"reflink"``
    or ``"copy"``; the first fallback in a process is logged at DEBUG with its cause (most
    filesystems, ext4 and tmpfs among them, have no reflinks: that is expected, not a fault).
    """
    if _reflink(src, dst):
        return "reflink"
    shutil.copyfile(src, dst)
    return "copy"


_COPY_CHUNK = 8 << 20


def clone_or_copy_hashed(src: Path, dst: Path) -> tuple[str, str]:
    """:func:`clone_or_copy` that also returns the sha256 of the bytes written, read once.

    A plain copy hashes each chunk as it passes from ``src`` to ``dst``: on a disk that
    writes slower than sha256 reads (here 0.6 against 1.2 GB/s) the hash costs nothing
    beside the copy, where copying and then hashing ``dst`` read the file twice. A reflink
    shares ``src``'s extents, so ``src`` is hashed. Returns ``(how, hex digest)``.
    """
    digest = hashlib.sha256()
    if _reflink(src, dst):
        with open(src, "rb") as fin:
            while chunk := fin.read(_COPY_CHUNK):
                digest.update(chunk)
        return "reflink", digest.hexdigest()
    buf = bytearray(_COPY_CHUNK)
    view = memoryview(buf)
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while n := fin.readinto(buf):
            digest.update(view[:n])
            fout.write(view[:n])
    return "copy", digest.hexdigest()


def _reflink(src: Path, dst: Path) -> bool:
    """Write ``dst`` as a reflink of ``src`` and return True, or create nothing and return
    False where the filesystem has no reflinks (logged once at DEBUG, as :func:`clone_or_copy`)."""
    global _reflink_failed_once
    if not hasattr(fcntl, "ioctl"):
        return False
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        try:
            fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
            return True
        except OSError as e:
            if not _reflink_failed_once:
                log.debug("no reflink from %s (%s); copying", src.parent, e)
                _reflink_failed_once = True
    os.unlink(dst)
    return False

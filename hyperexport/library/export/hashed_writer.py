"""An append-only file that knows its own sha256, and copies ranges of other files by kernel.

:class:`HashedWriter` is what :class:`~hyperexport.library.export.weights.WeightFile` writes
through. Two things make a large weight file cheap to write and to cache:

* **Kernel copies.** A tensor whose bytes are a range of a file on disk (a safetensors
  checkpoint) is copied with ``copy_file_range``: the kernel moves page-cache pages, where a
  ``write`` from the process's memory copies every byte through it. On this project's build
  machine, 4.9 GB took 2.8 to 6.3 s that way against 10 to 15 s written from a buffer
  (``bench/README.md``). Each copied chunk is then read back from the file and compared with
  the tensor in memory, so the file holds what the model holds, whatever the source did; a
  chunk that differs is rewritten from memory and the copy is reported as not made.
* **A digest as it is written.** Every byte is hashed in file order, on a worker thread (sha256
  releases the GIL) that reads the caller's memory, never the file: the cache then records the
  file by reference without reading it again (``engine/sourced.py``, ``FileSources.digest``).
  At most :data:`PENDING_LIMIT` bytes wait for the hash, so a streamed tensor's memory is not
  held for long.

Where ``copy_file_range`` is missing (not Linux) or refused (another filesystem), the bytes are
written from memory, and the copies are not vouched for (the cache then reads the file again to
check it); the first such fallback in a process is a WARNING with its cause.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import torch

log = logging.getLogger(__name__)

#: Bytes a kernel copy moves, and compares, at a time.
COPY_CHUNK = 64 << 20
#: Bytes handed to the hashing thread and not yet hashed, at most (the caller then waits).
PENDING_LIMIT = 256 << 20
#: Errors with which ``copy_file_range`` says it cannot copy between these files.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP})
_kernel_copy_refused_once = False


class CopyOutcome(enum.Enum):
    """What :meth:`HashedWriter.copy` did (the file holds the tensor's bytes in every case)."""

    #: Every byte is the kernel's copy of the range, and matched the tensor.
    COPIED = "copied"
    #: The kernel would not copy (see the module): written from memory, not compared.
    WRITTEN = "written"
    #: The range does not hold the tensor's bytes (changed, or the source is too short).
    DIFFERS = "differs"


class HashedWriter:
    """Writes a new file at increasing offsets and hashes every byte it writes.

    Use as a context manager; :attr:`digest` is the sha256 of the whole file once closed.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.size = 0
        self._fd = -1
        self._hash = hashlib.sha256()
        self._hasher: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Future[None], int]] = deque()
        self._pending_bytes = 0
        self._digest: str | None = None
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def __enter__(self) -> HashedWriter:
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights-sha256")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._hasher is not None
        try:
            self._drain(0)
        finally:
            self._hasher.shutdown(wait=True)
            self._hasher = None
            self._buffer = torch.empty(0, dtype=torch.uint8)
            os.close(self._fd)
            self._fd = -1
        if exc_type is None:
            self._digest = self._hash.hexdigest()

    @property
    def digest(self) -> str:
        """The sha256 of the closed file's bytes."""
        if self._digest is None:
            raise RuntimeError(f"{self.path.name}: digest of a file not closed cleanly")
        return self._digest

    def write(self, data: memoryview | bytes) -> None:
        """Append ``data`` (hashed from memory; ``data`` must not change until it is)."""
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            done += os.pwrite(self._fd, view[done:], self.size + done)
        self._hash_later(view)
        self.size += view.nbytes

    def copy(self, source: str, offset: int, expected: torch.Tensor) -> CopyOutcome:
        """Append ``expected``'s bytes, copied by the kernel from ``source`` at ``offset``.

        ``expected`` is a contiguous CPU tensor whose bytes the range should hold. Each chunk
        copied is read back and compared with it; from the first that differs, or that the
        kernel will not copy, on, the rest is written from ``expected``. So the file holds
        ``expected``'s bytes whatever the :class:`CopyOutcome`.
        """
        flat = expected.detach().reshape(-1).view(torch.uint8)
        total = flat.numel()
        at = self.size
        done = 0
        outcome = CopyOutcome.COPIED
        with open(source, "rb", buffering=0) as src:
            buffer = self._read_back_buffer(min(COPY_CHUNK, total))
            while done < total:
                n = min(COPY_CHUNK, total - done)
                outcome = self._kernel_copy(src.fileno(), offset + done, at + done, n)
                if outcome is not CopyOutcome.COPIED:
                    break
                got = os.preadv(self._fd, [byte_view(buffer)[:n]], at + done)
                if got != n or not torch.equal(buffer[:n], flat[done : done + n]):
                    outcome = CopyOutcome.DIFFERS
                    break
                self._hash_later(byte_view(flat[done : done + n]))
                done += n
        self.size = at + done
        if done < total:
            self.write(byte_view(flat[done:]))
        return outcome

    def _read_back_buffer(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` to read copied chunks back into, reused across
        copies (a new one per tensor costs a page fault per page, every time)."""
        if self._buffer.numel() < nbytes:
            self._buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        return self._buffer

    def _kernel_copy(self, src: int, src_offset: int, dst_offset: int, n: int) -> CopyOutcome:
        """Copy ``n`` bytes by ``copy_file_range``: COPIED; WRITTEN where the kernel will not
        (nothing written, nothing to trust); DIFFERS where the source ends first."""
        global _kernel_copy_refused_once
        copy_file_range = getattr(os, "copy_file_range", None)
        try:
            if copy_file_range is None:
                raise OSError(errno.ENOSYS, "os.copy_file_range is not available here")
            moved = 0
            while moved < n:
                step = copy_file_range(
                    src, self._fd, n - moved, src_offset + moved, dst_offset + moved
                )
                if step == 0:
                    return CopyOutcome.DIFFERS  # the source is shorter than its record says
                moved += step
            return CopyOutcome.COPIED
        except OSError as e:
            if e.errno not in _NO_KERNEL_COPY:
                raise
            if not _kernel_copy_refused_once:
                log.warning(
                    "%s: no kernel copy from the checkpoint (%s); writing the weights from "
                    "memory, and the cache will read the file again to check it",
                    self.path.name,
                    e,
                )
                _kernel_copy_refused_once = True
            return CopyOutcome.WRITTEN

    def _hash_later(self, view: memoryview) -> None:
        assert self._hasher is not None, "HashedWriter used outside its context"
        self._pending.append((self._hasher.submit(self._hash.update, view), view.nbytes))
        self._pending_bytes += view.nbytes
        self._drain(PENDING_LIMIT)

    def _drain(self, limit: int) -> None:
        """Wait for the oldest hashing until at most ``limit`` bytes are pending."""
        while self._pending and self._pending_bytes > limit:
            future, nbytes = self._pending.popleft()
            future.result()
            self._pending_bytes -= nbytes


def byte_view(flat: torch.Tensor) -> memoryview:
    """A zero-copy view of a contiguous uint8 CPU tensor's bytes (keeping them alive)."""
    return memoryview(flat.numpy())  # type: ignore[arg-type]

"""A tensor's bytes written into a data file, copied inside the kernel where they are already
in a file. No torch here.

A rewritten model's weights are mostly the export's, unchanged or side by side (packed
projections): their bytes are ranges of the export's data file. A packed weight whose members
are consecutive there is that range (:func:`stacked`) and nothing is written for it. What is
written (members that are not consecutive, the quantized model's float tensors) goes through
:func:`write_tensor`: ``tobytes()`` would map the range, copy it into a Python buffer and again
into the page cache; ``os.copy_file_range`` moves it from file to file inside the kernel. The
bytes written are the same either way. It saves memory and CPU, not wall time on a disk that is
the bottleneck (measured at 1B, ``bench/README.md``).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx_ir as ir

log = logging.getLogger(__name__)

#: Where ``copy_file_range`` cannot copy (another filesystem on an older kernel, a filesystem
#: without it): the bytes go through a buffer of this size instead.
_CHUNK = 8 << 20
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}
_warned = False


class ConcatenatedTensor(ir.LazyTensor):
    """Tensors side by side along axis 0, computed only when read. Its bytes are its parts'
    bytes in order (row-major), which :func:`write_tensor` copies part by part."""

    def __init__(self, parts: Sequence[ir.TensorProtocol], name: str) -> None:
        if not parts:
            raise ValueError(f"{name}: nothing to concatenate")
        first = parts[0]
        rest = [int(d) for d in first.shape.numpy()[1:]]
        for part in parts:
            if part.dtype != first.dtype or [int(d) for d in part.shape.numpy()[1:]] != rest:
                raise ValueError(
                    f"{name}: {part.name} ({part.dtype}, {part.shape}) does not stack on "
                    f"{first.name} ({first.dtype}, {first.shape}) along axis 0"
                )
        rows = sum(int(p.shape.numpy()[0]) for p in parts)
        self.parts = tuple(parts)

        def concatenated() -> ir.TensorProtocol:
            return ir.tensor(np.concatenate([p.numpy() for p in self.parts], axis=0), name=name)

        super().__init__(concatenated, dtype=first.dtype, shape=ir.Shape([rows, *rest]), name=name)


def stacked(parts: Sequence[ir.TensorProtocol], name: str) -> ir.TensorProtocol:
    """``parts`` side by side along axis 0, as one tensor that holds no bytes of its own.

    Where the parts are consecutive ranges of one data file, in order (the export writes a
    layer's query, key and value weights, and its gate and up weights, one after another), the
    result is that file's range: saving then has nothing to write for it, and the data file can
    stay the export's. Otherwise a :class:`ConcatenatedTensor`.
    """
    packed = ConcatenatedTensor(parts, name)  # checks that the parts stack
    external = [p for p in parts if isinstance(p, ir.ExternalTensor)]
    if len(external) < len(parts) or any(p.length is None for p in external):
        return packed
    first = external[0]
    end = first.offset or 0
    for part in external:
        if part.path != first.path or (part.offset or 0) != end:
            return packed
        end += part.length  # type: ignore[operator]
    return ir.ExternalTensor(
        first.location,
        first.offset or 0,
        end - (first.offset or 0),
        first.dtype,
        shape=packed.shape,
        name=name,
        base_dir=first.base_dir,
    )


def write_tensor(out: BinaryIO, tensor: ir.TensorProtocol) -> int:
    """Write ``tensor``'s bytes at ``out``'s position; return how many. An external tensor's
    range is copied from its file inside the kernel; a :class:`ConcatenatedTensor` part by part.

    ``out`` must be a regular file opened for writing without ``O_APPEND`` (which
    ``copy_file_range`` refuses): ``"wb"`` or ``"r+b"``.
    """
    if isinstance(tensor, ConcatenatedTensor):
        return sum(write_tensor(out, part) for part in tensor.parts)
    if isinstance(tensor, ir.ExternalTensor):
        offset = tensor.offset or 0
        length = tensor.length if tensor.length is not None else tensor.nbytes
        return _copy_range(Path(tensor.path), offset, length, out)
    raw = tensor.tobytes()
    out.write(raw)
    return len(raw)


def _copy_range(source: Path, offset: int, length: int, out: BinaryIO) -> int:
    """Copy ``length`` bytes of ``source`` from ``offset`` to ``out``'s position."""
    global _warned
    out.flush()
    start = out.tell()
    copied = 0
    kernel_copy = getattr(os, "copy_file_range", None)  # Linux only
    with open(source, "rb") as src:
        try:
            while kernel_copy is not None and copied < length:
                n = kernel_copy(
                    src.fileno(),
                    out.fileno(),
                    length - copied,
                    offset + copied,
                    start + copied,
                )
                if n == 0:
                    break
                copied += n
        except OSError as e:
            if e.errno not in _NO_KERNEL_COPY:
                raise
            if not _warned:
                log.warning(
                    "cannot copy %s inside the kernel (%s); copying through memory", source, e
                )
                _warned = True
        out.seek(start + copied)
        src.seek(offset + copied)
        while copied < length:
            chunk = src.read(min(_CHUNK, length - copied))
            if not chunk:
                raise OSError(
                    errno.EIO,
                    f"{length - copied} bytes missing at offset {offset + copied}",
                    str(source),
                )
            out.write(chunk)
            copied += len(chunk)
    return copied

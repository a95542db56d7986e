"""Unit weights as external data: every distinct weight written once, in one file, in one pass.

The unit export never puts weight bytes into a protobuf. The TorchScript path exports with
``export_params=False`` (weights are graph inputs without data) and the dynamo path's
initializers are references to the torch storage (``TorchTensor``); :class:`WeightFile` then
writes each distinct tensor once, straight from the live model's memory, to ``units/weights.data``
and points the unit's initializers at it (``ir.ExternalTensor``). Units therefore stay small
(no 2 GiB protobuf limit), and a weight shared by several units (a layer's weights are inputs of
the root's placeholder and initializers of the layer's body) is written once.

Offsets are aligned so that ONNX Runtime can map large tensors from the file in place.

Given a locator (:data:`Locator`, e.g. ``checkpoint_sources.py``'s), the file also learns where
its bytes come from: each tensor written unconverted, contiguous and whole from a file on disk
(a safetensors checkpoint) is recorded, and when every tensor was, :meth:`WeightFile.sources`
describes the file as ranges of those files and zeros (the padding): what a stage declares for
the cache to store a record instead of a second copy (``engine/sourced.py``, which the library
does not import; the stage converts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import numpy as np
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from hyperexport.base.contracts.names import WEIGHTS_FILE as WEIGHTS_FILE
from hyperexport.base.versions import torch_lacks_wide_unsigned_dtypes
from hyperexport.library.capture.torch_hooks import torch_dtype_name
from hyperexport.library.export.hashed_writer import CopyOutcome, HashedWriter, byte_view

log = logging.getLogger(__name__)

#: Tensors smaller than this stay inside the unit's protobuf (shape constants, scalars).
INLINE_LIMIT = 1024

#: Offset alignment of large tensors: 64 KiB, the mapping granularity ONNX Runtime needs to map
#: a tensor in place rather than copy it (Windows' allocation granularity; a page on Linux).
ALIGNMENT = 65536
#: Tensors up to this size are aligned to 64 bytes only (no page-size padding for small ones).
_ALIGN_ABOVE = 1 << 20

TensorKey = tuple[int, int, tuple[int, ...], tuple[int, ...], torch.dtype]


class StoredBytes(NamedTuple):
    """A tensor's bytes as stored in a file on disk: ``nbytes`` at ``offset`` of ``source``
    (an absolute path)."""

    source: str
    offset: int
    nbytes: int


#: Where a tensor's bytes are stored on disk, or None where they are not (or not known to be).
#: It must only place a tensor whose dtype, shape and bytes are the stored tensor's.
Locator = Callable[[torch.Tensor], StoredBytes | None]


@dataclass(frozen=True)
class WeightSources:
    """Where every byte of a closed weight file is: each tensor's copy, zeros elsewhere (the
    alignment padding).

    Attributes:
        size: The file's size.
        copies: ``(offset in the file, stored bytes)`` of each tensor placed, in file order.
        unplaced: ``(offset, length)`` of each tensor whose bytes are in no file on disk (a
            buffer the model computed, a constant the exporter made): only this file has them.
        digest: The file's sha256, when every copy was the kernel's and was compared with the
            tensor as written (``hashed_writer.py``): the file is then known to be what this
            describes. None when it is yet to be checked.
    """

    size: int
    copies: tuple[tuple[int, StoredBytes], ...]
    unplaced: tuple[tuple[int, int], ...] = ()
    digest: str | None = None

    @property
    def unplaced_bytes(self) -> int:
        return sum(length for _, length in self.unplaced)


def storage_key(tensor: torch.Tensor) -> TensorKey:
    """Identity of a tensor's bytes: the same storage, offset, shape, strides and dtype."""
    return (
        tensor.untyped_storage().data_ptr(),
        int(tensor.storage_offset()),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
    )


def _bytes_view(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as a zero-copy view (a copy only if it is not contiguous)."""
    flat = tensor.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    return byte_view(flat.view(torch.uint8))


class WeightFile:
    """Appends tensors to one external-data file and hands out references to them.

    Use as a context manager; the file is flushed and closed on exit.

    Args:
        path: The data file (created, or truncated).
        locate: Where the bytes of a tensor written by :meth:`reference` are stored on disk
            (None: nowhere known); what it places is recorded for :meth:`sources`.
    """

    def __init__(self, path: Path, locate: Locator | None = None) -> None:
        self.path = Path(path)
        self._locate = locate
        self._file: HashedWriter | None = None
        self._size = 0  # of the closed file
        self._digest: str | None = None  # of the closed file
        self._vouched = True  # every copy so far was the kernel's, and compared
        # Where each tensor went, by storage identity (storage_key) or by the caller's key.
        self._written: dict[Hashable, tuple[int, int]] = {}
        self._copies: list[tuple[int, StoredBytes]] = []
        self._unplaced: list[tuple[int, int]] = []
        #: Names of the tensors written whose bytes were placed in no file on disk.
        self.unplaced: list[str] = []
        self.tensors_written = 0

    def __enter__(self) -> WeightFile:
        self._file = HashedWriter(self.path).__enter__()  # closed in __exit__
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._file is not None
        writer, self._file = self._file, None
        writer.__exit__(exc_type, exc, tb)
        self._size, self._digest = writer.size, (writer.digest if exc_type is None else None)
        log.debug(
            "wrote %d weight tensors, %d bytes (%d of them copies of files on disk), to %s",
            self.tensors_written,
            self._size,
            sum(stored.nbytes for _, stored in self._copies),
            self.path.name,
        )

    def sources(self) -> WeightSources | None:
        """Where the closed file's bytes are: the tensors written unconverted from a file on
        disk, the ranges of the others (:attr:`unplaced` names them), and zeros (the padding);
        None when no tensor was placed.

        Raises:
            RuntimeError: The file is still open.
        """
        if self._file is not None:
            raise RuntimeError(f"{self.path.name}: sources() before the file is closed")
        if not self._copies:
            return None
        return WeightSources(
            self._size,
            tuple(self._copies),
            tuple(self._unplaced),
            self._digest if self._vouched else None,
        )

    @property
    def nbytes(self) -> int:
        """Bytes written so far (with alignment padding)."""
        return self._size if self._file is None else self._file.size

    def _pad_for(self, nbytes: int) -> int:
        """Write the padding that aligns a tensor of ``nbytes``; the offset it goes to."""
        assert self._file is not None, "WeightFile used outside its context"
        align = ALIGNMENT if nbytes > _ALIGN_ABOVE else 64
        pad = -self._file.size % align
        if pad:
            self._file.write(b"\0" * pad)
        return self._file.size

    def _write_bytes(self, data: memoryview, name: str) -> tuple[int, int]:
        """Append bytes in no file on disk (:attr:`unplaced`); their ``(offset, length)``."""
        assert self._file is not None, "WeightFile used outside its context"
        where = (self._pad_for(data.nbytes), data.nbytes)
        self._file.write(data)
        self._unplaced.append(where)
        self.unplaced.append(name)
        self.tensors_written += 1
        return where

    def _write_tensor(
        self, tensor: torch.Tensor, stored: StoredBytes | None, name: str
    ) -> tuple[int, int]:
        """Append ``tensor``'s bytes; their ``(offset, length)``.

        When ``stored`` says where they are on disk (and ``tensor`` is contiguous, on the CPU,
        and as long), they are copied from there by the kernel and compared with ``tensor``
        (``hashed_writer.py``), and the copy is recorded for :meth:`sources`. A tensor whose
        bytes differ from the stored ones (changed after loading) is written from memory and
        recorded as :attr:`unplaced`, as is one with nowhere to copy from.
        """
        assert self._file is not None, "WeightFile used outside its context"
        length = tensor.numel() * tensor.element_size()
        if (
            stored is None
            or length != stored.nbytes
            or tensor.device.type != "cpu"
            or not tensor.is_contiguous()
        ):
            return self._write_bytes(_bytes_view(tensor), name)
        where = (self._pad_for(length), length)
        outcome = self._file.copy(stored.source, stored.offset, tensor)
        self.tensors_written += 1
        if outcome is CopyOutcome.DIFFERS:
            log.info(
                "%s: %s differs from its stored bytes in %s (changed after loading); "
                "written from memory",
                self.path.name,
                name,
                Path(stored.source).name,
            )
            self._unplaced.append(where)
            self.unplaced.append(name)
        else:
            self._vouched = self._vouched and outcome is CopyOutcome.COPIED
            self._copies.append((where[0], stored))
        return where

    def reference(self, tensor: ir.TensorProtocol, name: str) -> ir.TensorProtocol:
        """A reference into the file holding ``tensor``'s bytes, written now unless already.

        Tensors below :data:`INLINE_LIMIT` bytes are returned as they are. A tensor backed by
        torch storage is written from that storage without a copy, and once per storage view.
        """
        if tensor.nbytes < INLINE_LIMIT or self._holds(tensor):
            return tensor
        # Any tensor over torch storage: onnx_ir's TorchTensor, or torch.onnx's own subclass.
        raw = getattr(tensor, "raw", None)
        if isinstance(raw, torch.Tensor):
            key = storage_key(raw)
            where = self._written.get(key)
            if where is None:
                stored = self._locate(raw) if self._locate is not None else None
                where = self._written[key] = self._write_tensor(raw, stored, name)
        else:
            where = self._write_bytes(memoryview(tensor.tobytes()), name)
        return self._external(where, tensor, name)

    def _external(
        self, where: tuple[int, int], like: ir.TensorProtocol, name: str
    ) -> ir.ExternalTensor:
        """The reference to the bytes at ``where`` (offset, length), typed and shaped as
        ``like``."""
        offset, length = where
        return ir.ExternalTensor(
            self.path.name,
            offset,
            length,
            like.dtype,
            shape=ir.Shape(like.shape.numpy()),
            name=name,
            base_dir=os.fspath(self.path.parent),
        )

    def _holds(self, tensor: ir.TensorProtocol) -> bool:
        """Whether ``tensor`` is already a reference into this file."""
        return (
            isinstance(tensor, ir.ExternalTensor)
            and tensor.location == self.path.name
            and tensor.base_dir == os.fspath(self.path.parent)
        )

    def reference_keyed(
        self,
        key: Hashable,
        load: Callable[[], torch.Tensor],
        like: ir.TensorProtocol,
        name: str,
        stored: StoredBytes | None = None,
    ) -> ir.TensorProtocol:
        """As :meth:`reference`, for a tensor known by ``key`` rather than by its storage: a
        streamed weight, whose bytes ``load`` returns only when they are to be written (written
        once per key; below :data:`INLINE_LIMIT` bytes, returned as a tensor to inline).

        ``stored``: where the bytes ``load`` returns are on disk, when it returns them
        unconverted (recorded for :meth:`sources`)."""
        if like.nbytes < INLINE_LIMIT:
            return torch_tensor(load(), name)
        where = self._written.get(key)
        if where is None:
            where = self._written[key] = self._write_tensor(load(), stored, name)
        return self._external(where, like, name)

    def externalize(self, graph: ir.Graph) -> None:
        """Point every large initializer of ``graph`` at its bytes in this file."""
        for name, value in graph.initializers.items():
            if value.const_value is not None:
                value.const_value = self.reference(value.const_value, name)


def attach_torch_weights(graph: ir.Graph, tensors: dict[str, torch.Tensor]) -> int:
    """Give graph inputs named like a weight that weight as their initializer (a reference).

    The TorchScript path exports with ``export_params=False``: weights are graph inputs named by
    their state-dict name, without data. Returns how many were attached.
    """
    attached = 0
    for value in graph.inputs:
        name = value.name or ""
        tensor = tensors.get(name)
        if tensor is None or name in graph.initializers:
            continue
        value.const_value = torch_tensor(tensor.detach(), name)
        graph.register_initializer(value)
        attached += 1
    return attached


#: ONNX's data type of each torch dtype a weight may have, by :func:`torch_dtype_name`.
_ONNX_DATA_TYPES = {
    "bool": ir.DataType.BOOL,
    "uint8": ir.DataType.UINT8,
    "int8": ir.DataType.INT8,
    "int16": ir.DataType.INT16,
    "int32": ir.DataType.INT32,
    "int64": ir.DataType.INT64,
    "float16": ir.DataType.FLOAT16,
    "bfloat16": ir.DataType.BFLOAT16,
    "float32": ir.DataType.FLOAT,
    "float64": ir.DataType.DOUBLE,
    "complex64": ir.DataType.COMPLEX64,
    "complex128": ir.DataType.COMPLEX128,
    "float8_e4m3fn": ir.DataType.FLOAT8E4M3FN,
    "float8_e4m3fnuz": ir.DataType.FLOAT8E4M3FNUZ,
    "float8_e5m2": ir.DataType.FLOAT8E5M2,
    "float8_e5m2fnuz": ir.DataType.FLOAT8E5M2FNUZ,
}


class _TorchTensorBeforeWideUnsigned(TorchTensor):
    """onnx_ir's ``TorchTensor`` for torch releases without ``torch.uint16``
    (:func:`~hyperexport.base.versions.torch_lacks_wide_unsigned_dtypes`): the dtype is converted
    here, and bfloat16 is read as int16 bits, where onnx_ir names ``torch.uint16``."""

    def __init__(self, tensor: torch.Tensor, name: str | None = None) -> None:
        dtype = _ONNX_DATA_TYPES.get(torch_dtype_name(tensor.dtype))
        if dtype is None:
            raise TypeError(f"weight {name!r}: torch dtype {tensor.dtype} has no ONNX data type")
        ir.Tensor.__init__(self, tensor, dtype=dtype, name=name)

    def numpy(self) -> np.ndarray:
        if self.dtype == ir.DataType.BFLOAT16:
            return self.raw.view(torch.int16).numpy(force=True).view(self.dtype.numpy())
        return super().numpy()


def torch_tensor(tensor: torch.Tensor, name: str) -> TorchTensor:
    """An ``ir.Tensor`` over ``tensor``'s storage (no copy), named ``name``."""
    if torch_lacks_wide_unsigned_dtypes():
        return _TorchTensorBeforeWideUnsigned(tensor, name=name)
    return TorchTensor(tensor, name=name)

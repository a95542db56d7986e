"""The capture container: a :class:`CaptureRecord` plus the tensors it refers to, as numpy
arrays. Nothing in it refers to live modules, so it can be saved (``capture.json`` +
``tensors.npz``), hashed and cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hyperexport.base.atomic import atomic_write_text
from hyperexport.base.contracts.arrays import load_arrays, raw_dtype, save_arrays
from hyperexport.base.contracts.names import CAPTURE_JSON, TENSORS_NPZ
from hyperexport.base.contracts.records import CaptureRecord, TensorMeta
from hyperexport.base.errors import (
    CorruptRecordError,
)
from hyperexport.library.capture.torch_hooks import (
    is_tracing,
    pause_tracing,
    resume_tracing,
    torch_dtype,
    torch_dtype_name,
)


def to_array(t: torch.Tensor) -> np.ndarray:
    """A detached CPU numpy copy of ``t`` (bfloat16 kept as raw bits).

    Under ``torch.jit.trace`` (the TorchScript path's capture) the tracer is paused meanwhile:
    it cannot record the dtype view of a bfloat16 tensor (an internal assert in torch 2.13).
    """
    paused = pause_tracing() if is_tracing() else None
    try:
        t = t.detach().cpu()
        bits = raw_dtype(torch_dtype_name(t.dtype))
        if bits is not None:
            return t.view(torch.int16).numpy().view(bits).copy()
        return t.numpy().copy()
    finally:
        if paused is not None:
            resume_tracing(paused)


def from_array(array: np.ndarray, dtype: str) -> torch.Tensor:
    """Inverse of :func:`to_array`."""
    if raw_dtype(dtype) is not None:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch_dtype(dtype))
    return torch.from_numpy(array.copy())


@dataclass(frozen=True)
class Capture:
    """A capture record plus its tensors (numpy arrays keyed like the record's trees)."""

    record: CaptureRecord
    arrays: Mapping[str, np.ndarray] = field(repr=False)

    def tensor(self, key: str) -> torch.Tensor:
        """The captured tensor ``key`` as a fresh torch tensor."""
        meta = self._meta[key]
        return from_array(self.arrays[key], meta.dtype)

    @property
    def _meta(self) -> dict[str, TensorMeta]:
        return {t.key: t for t in self.record.tensors}

    def save(self, directory: Path) -> None:
        """Write ``capture.json`` and ``tensors.npz`` into ``directory`` (atomically each)."""
        directory.mkdir(parents=True, exist_ok=True)
        save_arrays(directory / TENSORS_NPZ, self.arrays)
        atomic_write_text(directory / CAPTURE_JSON, self.record.dumps())

    @classmethod
    def load(cls, directory: Path) -> Capture:
        """Read a capture saved by :meth:`save`.

        Raises:
            CorruptRecordError: ``capture.json`` or ``tensors.npz`` is malformed (a build
                treats the cache entry holding them as corrupt and rebuilds it).
        """
        try:
            record = CaptureRecord.loads((directory / CAPTURE_JSON).read_text(encoding="utf-8"))
            return cls(record, load_arrays(directory / TENSORS_NPZ))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CorruptRecordError(
                f"capture in {directory}", f"unreadable: {type(e).__name__}: {e}"
            ) from e

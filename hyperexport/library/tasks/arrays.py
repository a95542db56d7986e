"""Arrays of the generation records as ``.npz`` (written atomically, read without pickle)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from hyperexport.base.atomic import atomic_write_bytes


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` in one atomic write."""
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **dict(arrays))  # type: ignore[arg-type]
    atomic_write_bytes(path, buffer.getvalue())


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of ``path`` (``allow_pickle=False``: the file is data)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}

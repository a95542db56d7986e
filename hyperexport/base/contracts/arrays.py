"""Save and load captured tensors as plain ``.npz`` arrays (numpy only, never pickles).

numpy has no bfloat16, so such tensors are stored as their raw ``uint16`` bits and the dtype is
taken from the capture record when loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from hyperexport.base.atomic import atomic_write_with

_RAW_BITS = {"bfloat16": np.uint16}


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically, in sorted key order (byte-stable)."""
    ordered = {k: arrays[k] for k in sorted(arrays)}
    atomic_write_with(path, lambda fh: np.savez(fh, **ordered))  # type: ignore[arg-type]


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Load every array of an ``.npz`` written by :func:`save_arrays`, refusing pickles."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def raw_dtype(dtype: str) -> type[np.generic] | None:
    """The numpy dtype used to store the bits of torch dtype ``dtype``, if numpy lacks it."""
    return _RAW_BITS.get(dtype)

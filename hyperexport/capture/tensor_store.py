"""Save and load captured tensors as plain ``.npz`` arrays (never pickles).

numpy has no bfloat16, so such tensors are stored as their raw ``uint16`` bits and the dtype is
taken from the capture record when loading.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

_RAW_BITS = {"bfloat16": np.uint16}


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically, in sorted key order (byte-stable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **{k: arrays[k] for k in sorted(arrays)})  # type: ignore[arg-type]
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """Load every array of an ``.npz`` written by :func:`save_arrays`, refusing pickles."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def raw_dtype(dtype: str) -> type[np.generic] | None:
    """The numpy dtype used to store the bits of torch dtype ``dtype``, if numpy lacks it."""
    return _RAW_BITS.get(dtype)

"""Read a saved capture (record + arrays) without torch: what the rewrite and check stages use.

The trace stage writes ``capture.json`` and ``tensors.npz`` (see
:meth:`hyperexport.library.capture.container.Capture.save`); this is their torch-free reader. The arrays are
loaded with ``allow_pickle=False``: a capture read back from the cache is data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hyperexport.base.contracts.arrays import load_arrays
from hyperexport.base.contracts.names import CAPTURE_JSON, TENSORS_NPZ
from hyperexport.base.contracts.records import CaptureRecord


@dataclass(frozen=True)
class CaptureFiles:
    """A capture as saved: its record and its tensors as numpy arrays (keys as in the record)."""

    record: CaptureRecord
    arrays: Mapping[str, np.ndarray] = field(repr=False)


def read_capture(directory: Path) -> CaptureFiles:
    """Read ``capture.json`` and ``tensors.npz`` from ``directory``."""
    record = CaptureRecord.loads((directory / CAPTURE_JSON).read_text(encoding="utf-8"))
    return CaptureFiles(record, load_arrays(directory / TENSORS_NPZ))

"""The check's adapter for onnxruntime-genai's shared KV buffers (``passes/share_kv_buffer.py``).

With ``rewrite.fuse: onnxruntime`` a generation step's pasts are buffers: a past may hold more
rows than its valid ones (onnxruntime-genai allocates ``max_length``), the valid length comes
from the attention mask, and a present is ``max(total, past length)`` rows long with the new
rows written after the valid ones. The captured pasts are exactly their valid rows, which is a
buffer too, so run as captured the model would never read a row it should not. The adapter
makes the run prove it: each buffer input (``ExportManifest.kv_buffers``, by owner and input
position) is fed with :data:`PADDED_ROWS` more rows along dim 2, all :data:`PADDING` (a value
that would show in any output that read one), and each 4-D output longer along dim 2 than its
reference is compared on the reference's rows (the present's valid rows). The whole model and
every call site of a function with buffers run so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Rows added to each buffer input, and their value.
PADDED_ROWS = 3
PADDING = 1.0e4


def padded(arrays: Sequence[np.ndarray], buffers: Sequence[int]) -> list[np.ndarray]:
    """``arrays`` with each one at a position in ``buffers`` padded along dim 2."""
    out = list(arrays)
    for i in buffers:
        past = out[i]
        rows = list(past.shape)
        rows[2] = PADDED_ROWS
        out[i] = np.concatenate([past, np.full(rows, PADDING, dtype=past.dtype)], axis=2)
    return out


def valid_rows(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """A present longer along dim 2 than its reference, cut to the reference's rows."""
    if actual.ndim == expected.ndim == 4 and actual.shape[2] > expected.shape[2]:
        return actual[:, :, : expected.shape[2]]
    return actual

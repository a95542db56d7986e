"""A call's weights as feeds of its function's standalone session, read from the data file.

The standalone model (``standalone.py``) takes a function's weights as graph inputs, so one
session serves every call of the function; each call is fed its own weights here. Weights are
the final model's initializers, external tensors over the published data file: numpy views over
a read-only map (file-backed pages, never anonymous). A session that runs upcast
(``upcast.py``) takes float32: a bfloat16 or float16 weight is converted into a float32 buffer
that is reused from call to call (bfloat16 exactly, by shifting its bits into the high half of a
float32), so a function's weights are held once in float32 however many calls it has. Other
weights are fed as the views themselves. After a run, :meth:`WeightFeeds.release` unmaps the
call's tensors, so their pages do not stay counted against the process.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from hyperexport.library.check.upcast import LOW_PRECISION


def _to_float32(array: np.ndarray, out: np.ndarray) -> None:
    """Convert a float16 or bfloat16 ``array`` into ``out`` (float32, same shape), exactly."""
    if array.dtype == np.float16:
        np.copyto(out, array)
    else:  # bfloat16: its 16 bits are the high half of the float32 with the same value
        np.left_shift(
            array.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32, casting="unsafe"
        )


class WeightFeeds:
    """Feeds for ``weight_<j>`` inputs, with one reused float32 buffer per input and slot.

    Args:
        upcast: Whether the session runs upcast (low-precision weights fed as float32).
        slots: How many calls' feeds may be alive at once (2: one call runs while the next
            call's weights are converted).
    """

    def __init__(self, upcast: bool, slots: int = 1) -> None:
        self._upcast = upcast
        self._buffers: list[dict[int, np.ndarray]] = [{} for _ in range(slots)]

    def feeds(self, tensors: Sequence[ir.TensorProtocol], slot: int = 0) -> dict[str, np.ndarray]:
        """``weight_<j>`` -> the array to feed for ``tensors[j]`` (into ``slot``'s buffers)."""
        buffers = self._buffers[slot]
        result: dict[str, np.ndarray] = {}
        for j, tensor in enumerate(tensors):
            array = tensor.numpy()
            if self._upcast and tensor.dtype in LOW_PRECISION:
                out = buffers.get(j)
                if out is None or out.shape != array.shape:
                    out = buffers[j] = np.empty(array.shape, dtype=np.float32)
                _to_float32(array, out)
                array = out
            result[f"weight_{j}"] = array
        return result

    @staticmethod
    def release(tensors: Sequence[ir.TensorProtocol]) -> None:
        """Unmap the data-file tensors among ``tensors`` (mapped again if read again)."""
        for tensor in tensors:
            if isinstance(tensor, ir.ExternalTensor):
                tensor.release()

    def clear(self) -> None:
        """Drop the float32 buffers (a session of another function comes next)."""
        for buffers in self._buffers:
            buffers.clear()

"""Captured arrays in their logical dtype: bfloat16 bits become ``ml_dtypes.bfloat16`` views.

``ml_dtypes`` (0.6 to 1.6 s to import) is imported only when a bfloat16 tensor is read, so a
check-only rebuild of a float32 model does without it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from hyperexport.base.contracts.arrays import raw_dtype
from hyperexport.base.contracts.records import CaptureRecord
from hyperexport.base.errors import CheckError


class CapturedArrays:
    """Read-only access to a capture's arrays, converted to the dtype torch had.

    Args:
        capture: The capture record (gives each key's torch dtype).
        arrays: The arrays of the capture's tensor store.
    """

    def __init__(self, capture: CaptureRecord, arrays: Mapping[str, np.ndarray]) -> None:
        self._dtypes = {t.key: t.dtype for t in capture.tensors}
        self._arrays = arrays

    def __contains__(self, key: str) -> bool:
        return key in self._arrays

    def get(self, key: str) -> np.ndarray:
        """The array stored under ``key``, in its logical dtype.

        Raises:
            CheckError: When the key is missing, or stored as raw bits of a dtype numpy lacks
                and this module cannot view (only bfloat16 is supported).
        """
        if key not in self._arrays:
            raise CheckError(f"capture has no tensor {key!r}")
        array = np.asarray(self._arrays[key])
        dtype = self._dtypes.get(key)
        if dtype is None or raw_dtype(dtype) is None:
            return array
        if dtype != "bfloat16":
            raise CheckError(f"tensor {key!r} has dtype {dtype}, which the check cannot read")
        if array.dtype != np.uint16:
            raise CheckError(
                f"tensor {key!r} (bfloat16) is stored as {array.dtype}, not uint16 bits"
            )
        import ml_dtypes

        return array.view(ml_dtypes.bfloat16)

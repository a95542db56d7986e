"""Refuse an export that cannot fit, before anything runs: the memory it needs beyond the loaded
model, and the protobuf limit of a model without external data.
"""

from __future__ import annotations

from hyperexport.base.errors import ResourceError
from hyperexport.library.meminfo import available_memory
from hyperexport.library.model_file import check_inline_size

#: Memory an export takes beyond the loaded model, over the weights' bytes (measured, issue 12:
#: 1.23x peak RSS for per_type/per_instance on both paths, with the model itself at 1.0x).
EXPORT_OVERHEAD = 0.3
#: Without external data the whole model is also serialized in memory (tensors read in, then
#: the protobuf): about two more copies.
INLINE_OVERHEAD = 2.0


def check_export_budget(
    weight_bytes: int, *, external_data: bool, available: int | None = None
) -> None:
    """Refuse, before anything runs, an export that cannot fit: one line, estimate and option.

    Args:
        weight_bytes: The loaded model's parameter and buffer bytes (already in memory).
        external_data: Whether the result keeps its tensors in a data file.
        available: Available memory in bytes (default: ``MemAvailable``; unknown: no check).

    Raises:
        ResourceError: Without external data over the 2 GiB protobuf limit, or when the memory
            the export needs beyond the model exceeds what is available.
    """
    if not external_data:
        check_inline_size(weight_bytes)
    if available is None:
        available = available_memory()
    if available is None:
        return
    share = EXPORT_OVERHEAD + (0.0 if external_data else INLINE_OVERHEAD)
    need = int(weight_bytes * share) + (256 << 20)
    if need > available:
        lower = (
            ""
            if external_data
            else (
                f"; external_data=True lowers it to about "
                f"{(weight_bytes * EXPORT_OVERHEAD + (256 << 20)) / 2**30:.1f} GiB"
            )
        )
        raise ResourceError(
            f"the export needs about {need / 2**30:.1f} GiB beyond the "
            f"{weight_bytes / 2**30:.1f} GiB model, {available / 2**30:.1f} GiB is available"
            f"{lower or '; free memory, or export on a larger machine'}"
        )

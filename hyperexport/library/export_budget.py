"""Refuse an export that cannot fit, before anything runs: the memory it needs beyond the loaded
model, the protobuf limit of a model without external data, and what a streamed build keeps
resident (:func:`streaming_need`, from the checkpoint's headers alone).
"""

from __future__ import annotations

import errno
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.base.contracts.weight_index import FLOAT_DTYPE_NAMES, ITEM_SIZES, WeightIndex
from hyperexport.base.errors import ResourceError
from hyperexport.base.sizes import human_size
from hyperexport.library.meminfo import available_memory
from hyperexport.library.model_file import check_inline_size

#: Memory an export takes beyond the loaded model, over the weights' bytes (measured, issue 12:
#: 1.23x peak RSS for per_type/per_instance on both paths, with the model itself at 1.0x).
EXPORT_OVERHEAD = 0.3
#: The copies of the weights a build keeps on the cache's disk at its peak: the export's data file,
#: kept as the build's one copy (moved from stage to stage and handed to the published folder),
#: and its blob in the cache (measured at 8B: 2.00x the data file, docs/streaming.md). One where
#: the cache records the weights as ranges of the checkpoint instead (1.00x at 8B).
DISK_COPIES = 2
#: What the interpreter, torch and transformers take before any weight (measured: 0.3 GB).
BASELINE_BYTES = 512 << 20
#: A streamed build's anonymous memory beyond the baseline, in float32 copies of its largest
#: layer's weights: the check feeds each call's weights converted to float32 in two buffer slots
#: (the next call's converted on a second thread) while ONNX Runtime keeps its own transposed
#: copies (measured at 8B, docs/streaming.md: 2.14 GB peak with 0.87 GB float32 layers over a
#: 0.3 GB baseline, 2.1 copies; 2.5 leaves room).
STREAM_LAYER_COPIES = 2.5
#: The dotted name of a numbered block (``model.layers.3``): up to its first all-digit part.
_BLOCK = re.compile(r"^(.*?\.\d+)\.")
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


@dataclass(frozen=True)
class StreamingNeed:
    """What a streamed build keeps in anonymous memory at its peak, estimated from the weight
    index (no weight bytes read).

    Attributes:
        total: The estimate in bytes: the baseline plus the larger of the check's need (float32
            copies of the largest block) and the trace's (converted copies, where the model's
            dtype is not the stored one, of everything outside the blocks and of one block).
        block: The largest numbered block (``model.layers.0``; ``"the model"`` without any).
        block_float32: That block's weights in float32 bytes.
    """

    total: int
    block: str
    block_float32: int

    def refusal(self, available: int) -> str:
        """The one line that refuses a build which cannot fit in ``available`` bytes."""
        return (
            f"a streamed build needs about {human_size(self.total)} (largest layer "
            f"{self.block}: {human_size(self.block_float32)} in float32 for the check), "
            f"{human_size(available)} is available"
        )


def streaming_need(index: WeightIndex, model_dtype: str | None = None) -> StreamingNeed:
    """The anonymous memory a streamed build of ``index``'s checkpoint needs at its peak.

    Blocks are found by name: the tensors under each ``<prefix>.<number>`` (a decoder layer, an
    encoder block). A streamed build binds one block at a time and maps the rest.

    Args:
        index: The checkpoint's weight index.
        model_dtype: The dtype the model is loaded in (``"bfloat16"``; None: as stored). Stored
            floating tensors of another dtype are converted copies while they are bound.
    """
    target = FLOAT_DTYPE_NAMES.get(model_dtype or "")
    blocks: dict[str, int] = {}
    converted: dict[str, int] = {}
    for name, stored in index.tensors.items():
        match = _BLOCK.match(name)
        block = match.group(1) if match else ""
        elements = stored.nbytes // ITEM_SIZES[stored.dtype]
        blocks[block] = blocks.get(block, 0) + elements * 4
        floating = stored.dtype in FLOAT_DTYPE_NAMES.values()
        if target is not None and floating and stored.dtype != target:
            converted[block] = converted.get(block, 0) + elements * ITEM_SIZES[target]
    numbered = sorted(b for b in blocks if b)
    block = max(numbered, key=blocks.__getitem__, default="")  # the first of the largest
    block_float32 = blocks.get(block, 0)
    check = int(block_float32 * STREAM_LAYER_COPIES)
    trace = converted.get("", 0) + max((converted.get(b, 0) for b in numbered), default=0)
    return StreamingNeed(
        total=BASELINE_BYTES + max(check, int(trace * (1 + EXPORT_OVERHEAD))),
        block=block or "the model",
        block_float32=block_float32,
    )


def state_bytes(model: Any) -> int:
    """Bytes of ``model``'s distinct parameters and buffers at their dtypes (0 for a
    non-module); a tensor on the meta device (a streamed model's) counts by identity."""
    tensors = [*getattr(model, "parameters", list)(), *getattr(model, "buffers", list)()]
    unique = {
        (id(t) if t.is_meta else t.untyped_storage().data_ptr()): t.numel() * t.element_size()
        for t in tensors
    }
    return sum(unique.values())


def check_disk_budget(
    weight_bytes: int, directory: Path, copies: int = 1, free: int | None = None
) -> None:
    """Refuse, before the first weight is written, an export whose weights the filesystem of
    ``directory`` cannot hold ``copies`` times (a build keeps :data:`DISK_COPIES`).

    Raises:
        OSError: ``ENOSPC`` naming ``directory``, with the need and what is free as its reason
            (in a build, the runner makes it the cache's refusal: exit 3).
    """
    if free is None:
        free = shutil.disk_usage(directory).free
    need = weight_bytes * copies
    if need > free:
        times = "" if copies == 1 else f"{copies} x "
        raise OSError(
            errno.ENOSPC,
            f"the export writes about {human_size(need)} ({times}the {human_size(weight_bytes)} "
            f"of weights), {human_size(free)} is free",
            str(directory),
        )

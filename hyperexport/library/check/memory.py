"""Whether the whole-model comparison fits in memory: an estimate against what is available.

Per-function parity runs one function at a time, so its memory is one block's weights. The
end-to-end run holds every weight in ONNX Runtime at once: about the model's tensor bytes for
float32 (ONNX Runtime reads them from the external data file; MatMul weight prepacking, which
would copy them, is off), and for float16/bfloat16, which runs upcast (``upcast.py``), a float32
copy of every weight plus its protobuf and ONNX Runtime's copy of it. When that does not fit,
the comparison is skipped and the report says why; it is never skipped silently.
"""

from __future__ import annotations

import logging

import onnx_ir as ir

from hyperexport.library.check.upcast import LOW_PRECISION, is_low_precision

logger = logging.getLogger(__name__)

#: Working memory of an ONNX Runtime session beyond its weights (activations, arenas).
SESSION_OVERHEAD = 512 << 20
#: Share of the available memory an end-to-end run may take.
BUDGET_SHARE = 0.8
#: An upcast model is serialized in one protobuf (no external data).
PROTOBUF_LIMIT = 2**31 - (64 << 20)


def tensor_bytes(model: ir.Model) -> tuple[int, int]:
    """``(all tensor bytes, low-precision tensor bytes)`` of ``model``, each tensor once."""
    from hyperexport.library.tensor_slots import tensor_slots

    seen: dict[int, ir.TensorProtocol] = {id(s.tensor): s.tensor for s in tensor_slots(model)}
    total = sum(t.nbytes for t in seen.values())
    low = sum(t.nbytes for t in seen.values() if t.dtype in LOW_PRECISION)
    return total, low


def end_to_end_skip_reason(model: ir.Model, available: int | None = None) -> str | None:
    """Why the whole-model comparison cannot run here, or None when it can.

    Args:
        model: The final model (loaded with onnx_ir; tensors are external references).
        available: Available memory in bytes (default: the system's ``MemAvailable``).
    """
    total, low = tensor_bytes(model)
    if is_low_precision(model):
        upcast = total + low  # every low-precision tensor doubles in float32
        if upcast > PROTOBUF_LIMIT:
            return (
                f"the model is float16/bfloat16, which runs upcast to float32 in one protobuf; "
                f"its float32 tensors take {upcast / 2**30:.2f} GiB, over the 2 GiB limit"
            )
        need = 3 * upcast + SESSION_OVERHEAD
    else:
        need = total + SESSION_OVERHEAD
    if available is None:
        from hyperexport.library.meminfo import available_memory

        available = available_memory()
    if available is None:
        logger.warning("cannot read the available memory; running the end-to-end comparison")
        return None
    if need > BUDGET_SHARE * available:
        return (
            f"the end-to-end run needs about {need / 2**30:.1f} GiB, "
            f"{available / 2**30:.1f} GiB available"
        )
    return None

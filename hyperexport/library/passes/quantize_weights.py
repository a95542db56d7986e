"""The numbers of weight quantization, in numpy: int4 blocks for ``MatMulNBits``, int8 columns
for ``DynamicQuantizeMatMul`` (both com.microsoft ops that ONNX Runtime's CPU provider runs).

The layouts follow ONNX Runtime's contract for these ops (its ``ContribOperators.md`` and its
own ``MatMulNBitsQuantizer``), written here without its C++ helpers so that the passes need no
ONNX Runtime:

* ``MatMulNBits`` with ``bits=4``: the weight ``W`` as torch's ``Linear`` holds it, ``[N, K]``
  (output features, input features), is cut along K into blocks of ``block_size``. Each block
  gets an asymmetric uint4 code: ``scale = (max - min) / 15`` over the block with 0 included in
  the range, ``zero_point = round(-min / scale)``, ``q = clip(round(w / scale) + zero_point)``.
  ``B`` is ``uint8 [N, k_blocks, block_size / 2]``, two codes per byte, the even element in the
  low nibble; ``scales`` is ``[N * k_blocks]``; ``zero_points`` is ``uint8 [N * ceil(k_blocks /
  2)]``, packed the same way along the blocks of one column. K is padded with zeros to a whole
  number of blocks.
  *Symmetric* blocks (``symmetric=True``, onnxruntime-genai's builder's default) have no zero
  points: the op's implicit one is 8, ``scale = v / -8`` where ``v`` is the block's element of
  largest magnitude (its sign kept, so that ``v`` itself becomes code 0 and the other end of the
  range reaches code 15 at most), ``q = clip(round(w / scale) + 8)``. ``MatMulNBits`` then skips
  the zero point's subtraction (measured at the small Llama's shapes, one row, accuracy level 4:
  a one-node session runs 9-16% faster).
* ``DynamicQuantizeMatMul``: ``B`` is ``int8 [K, N]`` symmetric per output column, with codes
  in the reduced range ``[-64, 64]`` (:data:`INT8_CODE_MAX`), ``b_scale`` ``[N]`` (``max |w| / 64``),
  ``b_zero_point`` ``int8 [N]`` zeros; the activations are quantized to uint8 at run time by the
  op itself. Why 7 bits: on x86 CPUs without VNNI (SSE4.1, AVX2, AVX-512 without VNNI) ONNX
  Runtime multiplies uint8 activations by int8 weights with ``pmaddubsw``, which adds two
  products into a saturating int16: ``2 * 255 * 127`` does not fit, ``2 * 255 * 64`` does. Full
  8-bit codes give the right answer on VNNI machines and a wrong one elsewhere (measured: 13%
  relative error on an AVX2 EPYC without VNNI, against 1% with the reduced range). ONNX
  Runtime's own quantizer calls this ``reduce_range`` ("7-bit" weights for non-VNNI CPUs), and
  its PR 12088 describes the overflow.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hyperexport.base.contracts.names import NO_QUANTIZATION
from hyperexport.base.thread_budget import thread_budget
from hyperexport.library.defaults import (
    INT4_BLOCK,
    INT8_DYNAMIC,
    MIN_BLOCK_SIZE,
    QUANTIZE_METHODS,
    block_size_problem,
)

__all__ = ["INT4_BLOCK", "INT8_DYNAMIC", "METHODS", "MIN_BLOCK_SIZE", "check_block_size"]

#: Every method a quantize pass accepts; ``none`` (no quantization) is the stage's business.
METHODS = tuple(m for m in QUANTIZE_METHODS if m != NO_QUANTIZATION)


def check_block_size(block_size: int) -> None:
    """Raise ``ValueError`` unless ``block_size`` is a power of two ≥ :data:`MIN_BLOCK_SIZE`."""
    problem = block_size_problem(block_size)
    if problem is not None:
        raise ValueError(f"block size {problem}")


@dataclass(frozen=True)
class Int4Blocks:
    """One weight in ``MatMulNBits`` form (see the module docstring for the layout)."""

    packed: np.ndarray
    scales: np.ndarray
    #: None for symmetric blocks (the op's implicit zero point, 8).
    zero_points: np.ndarray | None
    k: int
    n: int
    block_size: int

    def arrays(self) -> list[np.ndarray]:
        """``MatMulNBits``' inputs after ``A``: ``B``, ``scales`` and, if any, ``zero_points``."""
        rest = [] if self.zero_points is None else [self.zero_points]
        return [self.packed, self.scales, *rest]


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Pack uint4 codes along the last axis (even length), the even element in the low nibble."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


#: Elements per chunk that one thread quantizes at a time: its float32 working copy (1 MiB)
#: stays within a core's cache, and chunks are what the threads share out.
_CHUNK_ELEMENTS = 1 << 18


def quantize_int4_blocks(
    weight_nk: np.ndarray, block_size: int, symmetric: bool = False
) -> Int4Blocks:
    """Quantize a ``[N, K]`` float weight into ``MatMulNBits`` blocks along K.

    The work is cut into chunks (:data:`_CHUNK_ELEMENTS`) spread over this process's thread
    budget (numpy releases the GIL in its loops). A weight given as the transpose of a
    contiguous ``[K, N]`` array (a ``MatMul``'s ``B``, the usual case) is quantized in that
    layout, a slab of whole blocks of K at a time, and only the uint8 codes are transposed:
    gathering the float32 columns would cost more than all the arithmetic. Every element goes
    through the same float32 operations in the same order whichever way it is cut, so the result
    is the same bytes.

    Args:
        weight_nk: The weight, output features first (torch ``Linear.weight``), or the ``.T``
            view of a ``[K, N]`` array.
        block_size: Elements of K per block (a power of two ≥ 16).
        symmetric: Symmetric blocks, without zero points (see the module docstring).

    Returns:
        The packed codes, scales (the weight's dtype) and packed zero points (None when
        ``symmetric``).
    """
    check_block_size(block_size)
    n, k = weight_nk.shape
    blocks = -(-k // block_size)
    packed = np.empty((n, blocks, block_size // 2), dtype=np.uint8)
    scales = np.empty((n, blocks), dtype=weight_nk.dtype)
    zero_codes = np.zeros((n, blocks + blocks % 2), dtype=np.uint8)
    weight_kn = weight_nk.T
    along_k = weight_kn.flags.c_contiguous and not weight_nk.flags.c_contiguous
    step = max(1, _CHUNK_ELEMENTS // (block_size * n if along_k else blocks * block_size))

    def slab(first: int) -> None:
        """Blocks ``first`` to ``first + step`` of K, for every column (``[K, N]`` layout)."""
        last = min(first + step, blocks)
        w = np.empty(((last - first) * block_size, n), dtype=np.float32)
        rows = weight_kn[first * block_size : last * block_size]
        w[: len(rows)] = rows
        w[len(rows) :] = 0.0
        w3 = w.reshape(last - first, block_size, n)
        scale, zero = _codes(w3, 1, symmetric)
        codes = _pack_nibbles(w3.astype(np.uint8).transpose(0, 2, 1))  # [blocks, N, half]
        packed[:, first:last] = codes.transpose(1, 0, 2)
        scales[:, first:last] = scale.T
        zero_codes[:, first:last] = zero.T

    def rows(first: int) -> None:
        """Rows ``first`` to ``first + step``, every block (``[N, K]`` layout)."""
        last = min(first + step, n)
        w = np.empty((last - first, blocks * block_size), dtype=np.float32)
        w[:, :k] = weight_nk[first:last]
        w[:, k:] = 0.0
        w3 = w.reshape(last - first, blocks, block_size)
        scale, zero = _codes(w3, 2, symmetric)
        packed[first:last] = _pack_nibbles(w3.astype(np.uint8))
        scales[first:last] = scale
        zero_codes[first:last, :blocks] = zero

    work, starts = (slab, range(0, blocks, step)) if along_k else (rows, range(0, n, step))
    threads = min(thread_budget() or os.cpu_count() or 1, len(starts))
    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="int4") as pool:
            list(pool.map(work, starts))
    else:
        for first in starts:
            work(first)
    return Int4Blocks(
        packed=packed,
        scales=scales.reshape(-1),
        zero_points=None if symmetric else _pack_nibbles(zero_codes).reshape(-1),
        k=k,
        n=n,
        block_size=block_size,
    )


def _codes(w: np.ndarray, axis: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Turn the float32 blocks of ``w`` (a block runs along ``axis``) into their uint4 codes in
    place, as floats; return each block's scale and zero point (see the module docstring)."""
    low = np.minimum(w.min(axis=axis), 0.0)
    high = np.maximum(w.max(axis=axis), 0.0)
    if symmetric:
        scale = np.where(-low > high, low, high) / np.float32(-8.0)
    else:
        scale = (high - low) / 15.0
    safe = np.where(scale == 0.0, 1.0, scale)
    zero = np.full_like(scale, 8.0) if symmetric else np.clip(np.rint(-low / safe), 0, 15)
    np.divide(w, np.expand_dims(safe, axis), out=w)
    np.rint(w, out=w)
    w += np.expand_dims(zero, axis)
    np.clip(w, 0, 15, out=w)
    return scale, zero


def dequantize_int4_blocks(q: Int4Blocks) -> np.ndarray:
    """The float ``[N, K]`` weight that ``q`` stands for (what ``MatMulNBits`` multiplies by)."""
    blocks = q.packed.shape[1]
    codes = _unpack_nibbles(q.packed).astype(np.float32)
    if q.zero_points is None:
        zero = np.full((q.n, blocks), 8.0, dtype=np.float32)
    else:
        zero = _unpack_nibbles(q.zero_points.reshape(q.n, -1))[:, :blocks].astype(np.float32)
    scale = q.scales.reshape(q.n, blocks).astype(np.float32)
    w = (codes - zero[..., None]) * scale[..., None]
    return w.reshape(q.n, -1)[:, : q.k]


#: The largest int8 weight code (ONNX Runtime's ``reduce_range``), so that ``uint8 * int8`` pairs never saturate the
#: int16 sums of x86's ``pmaddubsw`` (see the module docstring).
INT8_CODE_MAX = 64


@dataclass(frozen=True)
class Int8Columns:
    """One weight in ``DynamicQuantizeMatMul`` form: ``int8 [K, N]``, per-column scales."""

    weight: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray


def quantize_int8_columns(weight_kn: np.ndarray) -> Int8Columns:
    """Quantize a ``[K, N]`` float weight (the MatMul's own ``B``) symmetrically per column,
    codes within ``±``:data:`INT8_CODE_MAX`."""
    w = weight_kn.astype(np.float32)
    scale = np.abs(w).max(axis=0) / INT8_CODE_MAX
    safe = np.where(scale == 0.0, 1.0, scale)
    codes = np.clip(np.rint(w / safe), -INT8_CODE_MAX, INT8_CODE_MAX).astype(np.int8)
    return Int8Columns(
        weight=codes,
        scales=scale.astype(weight_kn.dtype),
        zero_points=np.zeros(w.shape[1], dtype=np.int8),
    )


def dequantize_int8_columns(q: Int8Columns) -> np.ndarray:
    """The float ``[K, N]`` weight that ``q`` stands for."""
    return q.weight.astype(np.float32) * q.scales.astype(np.float32)

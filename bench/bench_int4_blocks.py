"""int4 block quantization of a model's MatMul weights: ours against ONNX Runtime's C++ kernel.

    python bench/bench_int4_blocks.py [--shape qwen2_0_5b] [--repeat 5] [--block-size 32]

Issue 35 asks the quantization to take at most 2x the time of ONNX Runtime's own quantizer on the
same weights. This measures the quantization itself, on every projection weight of a decoder of
the given shape (seeded random float32, in a ``MatMul``'s ``B`` layout ``[K, N]``, as both
quantizers receive them):

  ours  ``quantize_weights.quantize_int4_blocks(B.T, block_size)``, as ``QuantizeMatMulsPass``
        calls it (asymmetric, this process's thread budget)
  ort   ``onnxruntime.capi._pybind_state.quantize_matmul_4bits``, what ONNX Runtime's
        ``MatMulNBitsQuantizer`` calls (asymmetric, its own thread pool)

alternating, ``--repeat`` rounds after a warm-up, and prints the medians of wall and CPU
(``time.process_time``) time and their ratios, then how far the two agree: the share of equal
4-bit codes and the largest relative difference of the scales (the two round the same
formula differently in a few places; each dequantizes within one step of the other).

The graph handling around it (loading, rewriting and saving the model) is not in these figures:
``bench_quantize_stage.py`` times the whole stage against ``MatMulNBitsQuantizer`` end to end.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

#: One quantized weight: packed codes, scales, zero points.
Quantized = tuple[np.ndarray, np.ndarray, np.ndarray]

#: hidden, intermediate, layers, query heads, key/value heads, head size.
SHAPES = {
    "qwen2_0_5b": (896, 4864, 24, 14, 2, 64),
    "llama3_2_1b": (2048, 8192, 16, 32, 8, 64),
}


def projection_weights(shape: str, seed: int = 0) -> list[np.ndarray]:
    """Every projection weight of one decoder of ``shape``, ``[K, N]`` float32."""
    hidden, inter, layers, heads, kv_heads, head = SHAPES[shape]
    rng = np.random.default_rng(seed)
    sizes = [
        (hidden, heads * head),  # q
        (hidden, kv_heads * head),  # k
        (hidden, kv_heads * head),  # v
        (heads * head, hidden),  # o
        (hidden, inter),  # gate
        (hidden, inter),  # up
        (inter, hidden),  # down
    ]
    one_layer = [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in sizes]
    # The layers differ in values in a real model; the quantizers' time does not depend on them.
    return [w.copy() for _ in range(layers) for w in one_layer]


def ours(weights: list[np.ndarray], block_size: int) -> list[Quantized]:
    from hyperexport.library.passes.quantize_weights import quantize_int4_blocks

    out: list[Quantized] = []
    for w in weights:
        q = quantize_int4_blocks(w.T, block_size)
        out.append((q.packed, q.scales, q.zero_points))
    return out


def ort(weights: list[np.ndarray], block_size: int) -> list[Quantized]:
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    out: list[Quantized] = []
    for w in weights:
        k, n = w.shape
        blocks = -(-k // block_size)
        packed = np.zeros((n, blocks, block_size // 2), dtype=np.uint8)
        zero_points = np.zeros((n, (blocks + 1) // 2), dtype=np.uint8)
        scales = np.zeros((n, blocks), dtype=np.float32)
        quantize_matmul_4bits(packed, w, scales, zero_points, block_size, n, k, False)
        out.append((packed, scales.reshape(-1), zero_points.reshape(-1)))
    return out


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def agreement(a: list[Quantized], b: list[Quantized]) -> tuple[float, float]:
    """Share of equal 4-bit codes, and the largest relative difference of the scales."""
    equal = total = 0
    worst = 0.0
    for (pa, sa, _), (pb, sb, _) in zip(a, b, strict=True):
        for shift in (0, 4):
            ca, cb = (pa >> shift) & 0xF, (pb >> shift) & 0xF
            equal += int(np.count_nonzero(ca == cb))
            total += ca.size
        worst = max(worst, float(np.max(np.abs(sa - sb) / np.maximum(np.abs(sb), 1e-12))))
    return equal / total, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2_0_5b")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args()
    weights = projection_weights(args.shape)
    params = sum(w.size for w in weights)
    print(f"{args.shape}: {len(weights)} weights, {params / 1e6:.0f} M parameters", flush=True)
    runs: dict[str, list[tuple[float, float]]] = {"ours": [], "ort": []}
    results: dict[str, list[Quantized]] = {}
    for name, fn in (("ours", ours), ("ort", ort)):  # warm-up
        results[name] = fn(weights, args.block_size)
    for _ in range(args.repeat):
        for name, fn in (("ours", ours), ("ort", ort)):
            wall, cpu, _ = _timed(fn, weights, args.block_size)
            runs[name].append((wall, cpu))
    med = {
        name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
        for name, r in runs.items()
    }
    for name, (wall, cpu) in med.items():
        print(f"  {name:4}  wall {wall:.3f} s  CPU {cpu:.3f} s")
    print(
        f"  ours / ort: wall {med['ours'][0] / med['ort'][0]:.2f}x, "
        f"CPU {med['ours'][1] / med['ort'][1]:.2f}x (medians of {args.repeat})"
    )
    codes, scales = agreement(results["ours"], results["ort"])
    print(f"  equal codes {codes:.4%}; largest relative scale difference {scales:.2e}")


if __name__ == "__main__":
    main()

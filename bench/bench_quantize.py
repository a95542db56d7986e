"""int4 inside the functions vs ONNX Runtime's own int4 quantizer on a flat export (issue 26).

    python bench/bench_quantize.py [--models tiny qwen2_0_5b] [--rounds 30] [--block-size 32]

For each model (random weights; ``tiny``: ``zoo.tiny_llama`` 4 layers, hidden 64;
``qwen2_0_5b``: ``zoo.sized_decoder`` at Qwen2-0.5B's shape) on input_ids (1, 32) with an
all-ones mask, it makes four models in one process:

  ours_float   export_hyper_onnx(dynamo=True, functions=per_type), external data
  ours_int4    ours_float through QuantizeMatMulsPass(int4_block): MatMulNBits inside the functions
  plain_float  torch.onnx.export(dynamo=True), external data
  plain_int4   plain_float through ONNX Runtime's MatMulNBitsQuantizer (same block size,
               asymmetric, its defaults)

then prints their file sizes (model + data) and their ONNX Runtime latency with one thread
(``intra_op_num_threads=1``), the four sessions run interleaved round by round, median of
``--rounds`` after 3 warm-up runs each, and the relative L2 error of each int4 model against
its float model. Ratios are what to read: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def _model(name: str) -> Any:
    from hyperexport import zoo

    if name == "tiny":
        return zoo.tiny_llama(num_layers=4)
    return zoo.sized_decoder(name)


def _plain_wrapper(model: Any) -> Any:
    import torch

    class Plain(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Plain(model).eval()


def make_models(name: str, root: Path, block_size: int) -> dict[str, Path]:
    """Export and quantize the four variants under ``root``; their model files."""
    import onnx
    import onnx_ir as ir
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    from hyperexport import ExportOptions, export_hyper_onnx
    from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass

    model = _model(name)
    ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, 32, dtype=torch.int64)
    paths = {
        v: root / v / "model.onnx" for v in ("ours_float", "ours_int4", "plain_float", "plain_int4")
    }
    for path in paths.values():
        path.parent.mkdir(parents=True)
    layer = type(model.layers[0])
    timings = {}
    start = time.perf_counter()
    export_hyper_onnx(
        model,
        (),
        paths["ours_float"],
        kwargs={"input_ids": ids, "attention_mask": mask},
        hiera=[layer],
        dynamo=True,
        opset_version=18,
        external_data=True,
        options=ExportOptions(functions="per_type"),
    )
    timings["ours_export"] = time.perf_counter() - start
    start = time.perf_counter()
    quantized = ir.load(paths["ours_float"])
    QuantizeMatMulsPass("int4_block", block_size)(quantized)
    ir.save(quantized, paths["ours_int4"], external_data="model.onnx.data")
    timings["ours_quantize"] = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            _plain_wrapper(model),
            (ids, mask),
            str(paths["plain_float"]),
            dynamo=True,
            opset_version=18,
            input_names=["input_ids", "attention_mask"],
            external_data=True,
        )
    timings["plain_export"] = time.perf_counter() - start
    start = time.perf_counter()
    quantizer = MatMulNBitsQuantizer(
        onnx.load(paths["plain_float"]),
        algo_config=DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=False),
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(paths["plain_int4"]), use_external_data_format=True)
    timings["plain_quantize"] = time.perf_counter() - start
    print(json.dumps({"model": name, "seconds": {k: round(v, 2) for k, v in timings.items()}}))
    return paths


def measure(paths: dict[str, Path], rounds: int) -> dict[str, Any]:
    """Sizes, interleaved one-thread latencies and int4-vs-float errors of the four models."""
    import onnxruntime as ort

    feeds = {
        "input_ids": np.random.default_rng(0).integers(0, 128, (1, 32)).astype(np.int64),
        "attention_mask": np.ones((1, 32), dtype=np.int64),
    }
    sessions = {}
    for variant, path in paths.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        sessions[variant] = (session, {k: v for k, v in feeds.items() if k in names})
    outputs = {}
    for variant, (session, feed) in sessions.items():
        for _ in range(3):
            outputs[variant] = session.run(None, feed)[0]
    times: dict[str, list[float]] = {v: [] for v in sessions}
    for _ in range(rounds):
        for variant, (session, feed) in sessions.items():
            start = time.perf_counter()
            session.run(None, feed)
            times[variant].append(time.perf_counter() - start)
    median = {v: statistics.median(t) for v, t in times.items()}
    sizes = {v: _size(p.parent) for v, p in paths.items()}

    def rel(a: str, b: str) -> float:
        return float(np.linalg.norm(outputs[a] - outputs[b]) / np.linalg.norm(outputs[b]))

    return {
        "bytes": sizes,
        "median_seconds": median,
        "size_ratio": {
            "ours_int4/ours_float": sizes["ours_int4"] / sizes["ours_float"],
            "plain_int4/plain_float": sizes["plain_int4"] / sizes["plain_float"],
            "ours_int4/plain_int4": sizes["ours_int4"] / sizes["plain_int4"],
        },
        "latency_ratio": {
            "ours_int4/ours_float": median["ours_int4"] / median["ours_float"],
            "ours_float/plain_float": median["ours_float"] / median["plain_float"],
            "ours_int4/plain_int4": median["ours_int4"] / median["plain_int4"],
        },
        "rel_error": {
            "ours_int4 vs ours_float": rel("ours_int4", "ours_float"),
            "plain_int4 vs plain_float": rel("plain_int4", "plain_float"),
            "ours_float vs plain_float": rel("ours_float", "plain_float"),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny"], choices=["tiny", "qwen2_0_5b"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.INFO)
    import torch

    torch.set_num_threads(1)
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            paths = make_models(name, Path(tmp), args.block_size)
            result = measure(paths, args.rounds)
        print(json.dumps({"model": name, **result}, indent=1))


if __name__ == "__main__":
    main()

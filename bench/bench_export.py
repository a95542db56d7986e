"""Hierarchical export time against a plain torch.onnx.export, side by side in one run.

    python bench/bench_export.py [--layers 4 16 32] [--repeat 3]

For each tiny Llama depth it times, in the same process and interleaved:
  plain        torch.onnx.export(dynamo=False) of the same model (the baseline, ratio 1.0)
  per_instance export_hyper_onnx(hiera=[LlamaDecoderLayer], functions=per_instance)
  per_type     export_hyper_onnx(hiera=[LlamaDecoderLayer], functions=per_type)
and prints the median of each, its ratio to plain, and the file sizes. Absolute seconds on a
shared machine are noise; the ratios are the figures to report.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import warnings

import torch

from hyperexport import ExportOptions, export_hyper_onnx, zoo
from hyperexport.capture.model_patches import export_context


class _Plain(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


def _plain(model: torch.nn.Module, ids: torch.Tensor) -> int:
    buffer = io.BytesIO()
    with export_context(model, dynamo=False), torch.no_grad():
        torch.onnx.export(_Plain(model).eval(), (ids,), buffer, dynamo=False, opset_version=18)
    return len(buffer.getvalue())


def _hier(model: torch.nn.Module, ids: torch.Tensor, mode: str) -> int:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    buffer = io.BytesIO()
    export_hyper_onnx(
        model,
        (ids,),
        buffer,
        hiera=[LlamaDecoderLayer],
        dynamo=False,
        opset_version=18,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
    )
    return len(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    print(f"torch {torch.__version__}; median of {args.repeat} interleaved runs")
    print(f"{'layers':>6} {'variant':>12} {'seconds':>8} {'ratio':>6} {'MB':>7}")
    for layers in args.layers:
        model = zoo.tiny_llama(num_layers=layers)
        runs = {
            "plain": lambda m=model: _plain(m, ids),
            "per_instance": lambda m=model: _hier(m, ids, "per_instance"),
            "per_type": lambda m=model: _hier(m, ids, "per_type"),
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        sizes: dict[str, int] = {}
        for k, fn in runs.items():  # warm-up: imports, first-trace costs
            sizes[k] = fn()
        for _ in range(args.repeat):
            for k, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - start)
        base = statistics.median(times["plain"])
        for k in runs:
            med = statistics.median(times[k])
            print(f"{layers:>6} {k:>12} {med:>8.3f} {med / base:>6.2f} {sizes[k] / 1e6:>7.2f}")


if __name__ == "__main__":
    main()

"""Hierarchical export time against a plain torch.onnx.export, side by side in one run.

    python bench/bench_export.py [--layers 4 16 32] [--repeat 3]

For each tiny Llama depth it times, in the same process and interleaved:
  plain        torch.onnx.export(dynamo=False) of the same model (the baseline, ratio 1.0)
  per_instance export_hyper_onnx(hiera=[LlamaDecoderLayer], functions=per_instance)
  per_type     export_hyper_onnx(hiera=[LlamaDecoderLayer], functions=per_type)
and prints the median of each, its ratio to plain, and the file sizes. Absolute seconds on a
shared machine are noise; the ratios are the figures to report. Both CPU time of this process
(``time.process_time``, with torch on one thread, robust to other load on the machine) and wall
time are reported.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import warnings

import torch

from hyperexport import ExportOptions, export_hyper_onnx, zoo
from hyperexport.library.capture.model_patches import export_context


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
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    print(
        f"torch {torch.__version__}; median of {args.repeat} interleaved runs; {args.threads} thread(s)"
    )
    print(
        f"{'layers':>6} {'variant':>12} {'cpu s':>7} {'ratio':>6} {'wall s':>7} {'ratio':>6} {'MB':>6}"
    )
    for layers in args.layers:
        model = zoo.tiny_llama(num_layers=layers)
        runs = {
            "plain": lambda m=model: _plain(m, ids),
            "per_instance": lambda m=model: _hier(m, ids, "per_instance"),
            "per_type": lambda m=model: _hier(m, ids, "per_type"),
        }
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        wall: dict[str, list[float]] = {k: [] for k in runs}
        sizes: dict[str, int] = {}
        for k, fn in runs.items():  # warm-up: imports, first-trace costs
            sizes[k] = fn()
        for _ in range(args.repeat):
            for k, fn in runs.items():
                c, w = time.process_time(), time.perf_counter()
                fn()
                cpu[k].append(time.process_time() - c)
                wall[k].append(time.perf_counter() - w)
        base_c, base_w = statistics.median(cpu["plain"]), statistics.median(wall["plain"])
        for k in runs:
            c, w = statistics.median(cpu[k]), statistics.median(wall[k])
            print(
                f"{layers:>6} {k:>12} {c:>7.3f} {c / base_c:>6.2f} {w:>7.3f} {w / base_w:>6.2f}"
                f" {sizes[k] / 1e6:>6.2f}"
            )


if __name__ == "__main__":
    main()

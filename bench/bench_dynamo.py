"""Time the dynamo hierarchical export against a plain ``torch.onnx.export(dynamo=True)``.

Both run in the same process on the same model and inputs, after one warm-up export of each
kind (imports, torch.onnx's registries and torch.export's caches are paid once, as they are in a
real session). Each timing is the best of ``--repeat`` runs and covers the whole call, from the
module to serialized bytes. The plain export uses torch's defaults (``optimize=True``); the
hierarchical one includes capture, the unit export, composition and hyperexport's passes.

Two clocks are reported: CPU time of this process (``time.process_time``, with torch on one
thread, so that other load on a shared machine does not count) and wall time. The ratios to the
plain export are the figures to report; absolute seconds vary with the machine.

Usage::

    python bench/bench_dynamo.py [--layers 16] [--repeat 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hyperexport import export_hyper_onnx, zoo
from hyperexport.library.options import ExportOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """The best CPU and wall time of several runs, in seconds."""

    cpu: float
    wall: float


@dataclass(frozen=True)
class Row:
    """One model's timings, and the hierarchical/plain ratios."""

    model: str
    plain: Timing
    per_instance: Timing
    per_type: Timing

    def ratios(self) -> dict[str, float]:
        """``{mode_clock: hierarchical / plain}`` for both modes and both clocks."""
        return {
            f"{mode}_{clock}": getattr(getattr(self, mode), clock) / getattr(self.plain, clock)
            for mode in ("per_instance", "per_type")
            for clock in ("cpu", "wall")
        }


def plain_export(model: torch.nn.Module, args: tuple[torch.Tensor, ...], opset: int) -> bytes:
    """``torch.onnx.export(dynamo=True)`` with torch's defaults, to bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, opset_version=opset, verbose=False)
    if program is None:
        raise RuntimeError("torch.onnx.export(dynamo=True) returned None")
    return program.model_proto.SerializeToString()


def hyper_export(
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    hiera: list[type],
    mode: str,
    opset: int,
) -> bytes:
    """``export_hyper_onnx(dynamo=True)`` in ``mode``, to bytes."""
    buffer = io.BytesIO()
    export_hyper_onnx(
        model,
        args,
        buffer,
        hiera=hiera,
        dynamo=True,
        opset_version=opset,
        options=ExportOptions(functions=mode),  # type: ignore[arg-type]
    )
    return buffer.getvalue()


def best_of(repeat: int, fn: Callable[[], Any]) -> Timing:
    """The shortest CPU and the shortest wall time of ``repeat`` calls of ``fn``."""
    cpu, wall = [], []
    for _ in range(repeat):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return Timing(min(cpu), min(wall))


def bench(
    name: str,
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    hiera: list[type],
    repeat: int,
    opset: int,
) -> Row:
    """Time plain, per-instance and per-type export of one model."""
    plain = best_of(repeat, lambda: plain_export(model, args, opset))
    inst = best_of(repeat, lambda: hyper_export(model, args, hiera, "per_instance", opset))
    typ = best_of(repeat, lambda: hyper_export(model, args, hiera, "per_type", opset))
    row = Row(name, plain, inst, typ)
    ratios = row.ratios()
    log.info(
        "%s: CPU plain %.2fs, per_instance %.2fs (%.2fx), per_type %.2fs (%.2fx)",
        name,
        plain.cpu,
        inst.cpu,
        ratios["per_instance_cpu"],
        typ.cpu,
        ratios["per_type_cpu"],
    )
    return row


def warm_up(opset: int) -> None:
    """One small export of each kind, so that one-off costs are not charged to the first row."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    plain_export(model, (ids,), opset)
    hyper_export(model, (ids,), [LlamaDecoderLayer], "per_instance", opset)


def print_table(rows: list[Row]) -> None:
    """One line per model and clock: seconds of each export and the ratios to plain."""
    print(
        f"{'model':<10} {'clock':<5} {'plain':>7} {'per_inst':>9} {'ratio':>6} "
        f"{'per_type':>9} {'ratio':>6}"
    )
    for r in rows:
        ratios = r.ratios()
        for clock in ("cpu", "wall"):
            print(
                f"{r.model:<10} {clock:<5} {getattr(r.plain, clock):7.2f} "
                f"{getattr(r.per_instance, clock):9.2f} {ratios[f'per_instance_{clock}']:6.2f} "
                f"{getattr(r.per_type, clock):9.2f} {ratios[f'per_type_{clock}']:6.2f}"
            )


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="tiny Llama decoder layers")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timing (best is kept)")
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    # The plain export logs "torchvision is not installed" notices on every call.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.resnet.modeling_resnet import ResNetBasicLayer, ResNetStage

    warm_up(ns.opset)
    llama = zoo.tiny_llama(num_layers=ns.layers)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    resnet = zoo.tiny_resnet()
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    rows = [
        bench(f"llama-{ns.layers}", llama, (ids,), [LlamaDecoderLayer], ns.repeat, ns.opset),
        bench("resnet", resnet, (pixels,), [ResNetStage, ResNetBasicLayer], ns.repeat, ns.opset),
    ]
    print_table(rows)
    if ns.json:
        data = [{**asdict(r), "ratios": r.ratios()} for r in rows]
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

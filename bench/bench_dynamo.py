"""Time the dynamo hierarchical export against a plain ``torch.onnx.export(dynamo=True)``.

Both run in the same process on the same model and inputs, after one warm-up export of each
kind (imports, torch.onnx's registries and torch.export's caches are paid once, as they are in a
real session). Each timing is the best of ``--repeat`` runs and covers the whole call, from the
module to serialized bytes. The plain export uses torch's defaults (``optimize=True``); the
hierarchical one includes capture, per-unit exports, composition and hyperexport's optimizer.

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
from hyperexport.options import ExportOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One model's timings in seconds, and the hierarchical/plain ratios."""

    model: str
    plain: float
    per_instance: float
    per_type: float

    @property
    def ratio_per_instance(self) -> float:
        return self.per_instance / self.plain

    @property
    def ratio_per_type(self) -> float:
        return self.per_type / self.plain


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


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    """The shortest wall time of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench(
    name: str,
    model: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    hiera: list[type],
    repeat: int,
    opset: int,
) -> Row:
    """Time plain, per-instance and per-type export of one model, interleaved per repeat."""
    plain = best_of(repeat, lambda: plain_export(model, args, opset))
    inst = best_of(repeat, lambda: hyper_export(model, args, hiera, "per_instance", opset))
    typ = best_of(repeat, lambda: hyper_export(model, args, hiera, "per_type", opset))
    row = Row(name, plain, inst, typ)
    log.info(
        "%s: plain %.2fs, per_instance %.2fs (%.2fx), per_type %.2fs (%.2fx)",
        name,
        plain,
        inst,
        row.ratio_per_instance,
        typ,
        row.ratio_per_type,
    )
    return row


def warm_up(opset: int) -> None:
    """One small export of each kind, so that one-off costs are not charged to the first row."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    model = zoo.tiny_llama(num_layers=1)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    plain_export(model, (ids,), opset)
    hyper_export(model, (ids,), [LlamaDecoderLayer], "per_instance", opset)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16, help="tiny Llama decoder layers")
    parser.add_argument("--repeat", type=int, default=2, help="runs per timing (best is kept)")
    parser.add_argument("--opset", type=int, default=18)
    parser.add_argument("--json", help="also write the rows to this JSON file")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

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
    print(f"{'model':<10} {'plain':>8} {'per_inst':>9} {'ratio':>6} {'per_type':>9} {'ratio':>6}")
    for r in rows:
        print(
            f"{r.model:<10} {r.plain:8.2f} {r.per_instance:9.2f} {r.ratio_per_instance:6.2f} "
            f"{r.per_type:9.2f} {r.ratio_per_type:6.2f}"
        )
    if ns.json:
        data = [
            {
                **asdict(r),
                "ratio_per_instance": r.ratio_per_instance,
                "ratio_per_type": r.ratio_per_type,
            }
            for r in rows
        ]
        with open(ns.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
    return rows


if __name__ == "__main__":
    main()

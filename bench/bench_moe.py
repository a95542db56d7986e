"""ORT latency of an exported mixture-of-experts decoder against the eager transformers model.

The model is a seeded random MoE decoder stack (``MixtralModel``, ``Qwen2MoeModel`` or
``OlmoeModel``). It is exported with ``export_hyper_onnx`` (decoder layer, router, experts and
Qwen2-MoE's shared expert as functions; the export uses hyperexport's exportable MoE formulation,
rank top-k and dense experts) and run in ONNX Runtime; the eager model runs transformers' own
forward (its default experts implementation, ``grouped_mm`` on CPU). Both on one thread, same
``input_ids``, runs alternating; the median wall and CPU time (``time.process_time``, which other
load on the machine barely moves) of each and their ratios are reported, after checking that both
give the same output (max abs diff printed).

    python bench/bench_moe.py --sizes tiny wide --seq 32 --repeat 30
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: ``size -> (hidden, intermediate, experts, top_k, layers)``; tiny is the zoo recipes' size.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 128, 4, 2, 2),
    "wide": (512, 1024, 8, 2, 4),
}


def _model(kind: str, size: str) -> torch.nn.Module:
    from hyperexport.zoo import MOE_CONFIGS, random_transformer

    hidden, inter, experts, top_k, layers = SIZES[size]
    model_class, fields = MOE_CONFIGS[kind]
    fields = dict(fields, num_experts_per_tok=top_k)
    fields["num_local_experts" if kind == "mixtral" else "num_experts"] = experts
    if kind == "qwen2_moe":
        fields.update(moe_intermediate_size=inter // 2, shared_expert_intermediate_size=inter)
    config = dict(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 32,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        **fields,
    )
    return random_transformer(model_class, config, seed=0)


class _LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids).last_hidden_state


def _hiera(model: Any) -> list[type]:
    mlp = model.layers[0].mlp
    classes = [type(model.layers[0]), type(mlp.gate), type(mlp.experts)]
    if hasattr(mlp, "shared_expert"):
        classes.append(type(mlp.shared_expert))
    return classes


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench(kind: str, size: str, seq: int, repeat: int, dynamo: bool, out: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from hyperexport import export_hyper_onnx

    model = _model(kind, size)
    wrapper = _LastHidden(model).eval()
    ids = torch.randint(0, 1024, (1, seq), generator=torch.Generator().manual_seed(0))
    path = out / f"{kind}_{size}.onnx"
    export_hyper_onnx(
        wrapper,
        (ids,),
        path,
        hiera=_hiera(model),
        dynamo=dynamo,
        input_names=["input_ids"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}},
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids.numpy()}
    with torch.no_grad():
        expected = wrapper(ids).numpy()
    diff = float(np.abs(session.run(None, feed)[0] - expected).max())
    eager: list[float] = []
    onnx: list[float] = []
    eager_cpu: list[float] = []
    onnx_cpu: list[float] = []
    with torch.no_grad():
        for _ in range(3):  # warm-up
            wrapper(ids)
            session.run(None, feed)
        for _ in range(repeat):
            start, cpu = time.perf_counter(), time.process_time()
            wrapper(ids)
            eager.append(time.perf_counter() - start)
            eager_cpu.append(time.process_time() - cpu)
            start, cpu = time.perf_counter(), time.process_time()
            session.run(None, feed)
            onnx.append(time.perf_counter() - start)
            onnx_cpu.append(time.process_time() - cpu)
    return {
        "kind": kind,
        "size": size,
        "seq": seq,
        "max_abs": diff,
        "eager_ms": _median_ms(eager),
        "ort_ms": _median_ms(onnx),
        "ratio": _median_ms(onnx) / _median_ms(eager),
        "eager_cpu_ms": _median_ms(eager_cpu),
        "ort_cpu_ms": _median_ms(onnx_cpu),
        "cpu_ratio": _median_ms(onnx_cpu) / _median_ms(eager_cpu),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="*", default=["mixtral", "qwen2_moe", "olmoe"])
    parser.add_argument("--sizes", nargs="*", default=["tiny", "wide"], choices=sorted(SIZES))
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--dynamo", action="store_true", help="export on the dynamo path")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        "| model | size | seq | ORT max diff | eager ms | ORT ms | ORT / eager (wall) "
        "| eager CPU ms | ORT CPU ms | ORT / eager (CPU) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            for kind in args.kinds:
                r = bench(kind, size, args.seq, args.repeat, args.dynamo, Path(tmp))
                print(
                    f"| {r['kind']} | {r['size']} | {r['seq']} | {r['max_abs']:.1e} "
                    f"| {r['eager_ms']:.2f} | {r['ort_ms']:.2f} | {r['ratio']:.2f} "
                    f"| {r['eager_cpu_ms']:.2f} | {r['ort_cpu_ms']:.2f} | {r['cpu_ratio']:.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

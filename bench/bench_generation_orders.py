"""Tokens per CPU second in onnxruntime-genai of generation folders, each fresh process loading
them in another order: ratios to the first folder, median and range over the processes.

Where in one process a model is loaded moves its speed: the same folders decoded in one process
give ratios 2% apart from one load order to the next at 8 layers, and the first-loaded 1B model
decodes up to 10% slower (``bench/README.md``), more than the changes measured here. So every
process loads the folders in its own order (seeded shuffles, rotated so that each folder loads
first equally often: use a multiple of the folders' count), decodes every folder once per round for ``--repeat`` rounds (a ``--prompt``-token prompt, then
``--tokens`` new tokens, greedy, one thread, each model loaded once), and reports each folder's
median tokens per CPU second over the first folder's; the figure is the median of those ratios
over ``--processes`` processes, with their least and greatest.

    python bench/bench_generation_orders.py builder=OUT/builder_int4 ours=OUT/fused_int4 \
        --processes 6 --repeat 15

With ``--alone`` each process loads one folder only, the folders taking turns (process k the
k-th folder, cyclically): no model shares a process, so no load order moves one; a round is one
process per folder, one after the other, and its ratios are each folder's rate over the base's
in that round (the figure is their median over the rounds, with their range). At the 1B shape,
two models in one process moved by about 8% with their order; ``bench/README.md``.

With ``--make OUT`` the folders of ``bench_generation.py --fuse --builder fp32 int4`` (8 layers,
hidden 256: ours fused fp32, int4 and int4 symmetric; the builder's fp32 and int4) are built into
``OUT`` first, and named on the command line as ``label=OUT/<folder>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def ratios(rates: dict[str, float], base: str) -> dict[str, float]:
    """Each folder's rate over the base folder's."""
    return {label: rate / rates[base] for label, rate in rates.items() if label != base}


def summary(per_process: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    """Per folder: the median of its ratios over the processes, their least and greatest."""
    labels = per_process[0].keys()
    return {
        label: (
            statistics.median(p[label] for p in per_process),
            min(p[label] for p in per_process),
            max(p[label] for p in per_process),
        )
        for label in labels
    }


def orders(labels: list[str], processes: int) -> list[list[str]]:
    """The load order of each process: every ``len(labels)`` processes a new seeded shuffle,
    rotated so that each folder loads first once in them (the first-loaded model is the one a
    process's placement moves most); seeded, so reruns load alike."""
    out = []
    for k in range(processes):
        cycle, turn = divmod(k, len(labels))
        base = list(labels)
        random.Random(cycle).shuffle(base)
        out.append(base[turn:] + base[:turn])
    return out


def child(order: list[tuple[str, Path]], prompt_length: int, tokens: int, repeat: int) -> None:
    """One process: load in ``order``, decode round by round, print median tokens/CPU-s."""
    import bench_generation as bg
    import numpy as np

    vocab = json.loads((order[0][1] / "genai_config.json").read_text())["model"]["vocab_size"]
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, prompt_length)]
    models = {label: bg._loaded(folder) for label, folder in order}
    for label, folder in order:
        bg.decode(folder, prompt, 4, models[label])
    rates: dict[str, list[float]] = {label: [] for label, _ in order}
    for _ in range(repeat):
        for label, folder in order:
            _, cpu_rate, _ = bg.decode(folder, prompt, tokens, models[label])
            rates[label].append(cpu_rate)
    models.clear()
    print(json.dumps({label: statistics.median(v) for label, v in rates.items()}))


def alone_rounds(labels: list[str], processes: int) -> list[list[str]]:
    """``--alone``: the folder of each process, grouped by round (one process per folder, in
    the order given); ``processes`` must be a multiple of the folders' count."""
    if processes % len(labels):
        raise ValueError(f"--alone: --processes {processes} is not a multiple of {len(labels)}")
    return [list(labels) for _ in range(processes // len(labels))]


def make(out: Path) -> None:
    """The 8-layer folders of ``bench_generation.py --fuse --builder fp32 int4``, kept."""
    import bench_generation as bg
    import torch

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model = bg._model(8, 256, 2048)
    folders = bg.export_both(model, out, fuse=True)
    checkpoint = out / "ckpt"
    model.save_pretrained(checkpoint)
    bg.write_tokenizer(checkpoint, 2048)
    for precision in ("fp32", "int4"):
        folders[f"builder {precision}"] = bg.build_with_builder(
            checkpoint, out / f"builder_{precision}", precision
        )
    for label, folder in folders.items():
        print(f"{label}: {folder}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", help="label=folder; the first is the base")
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--make", type=Path, help="build the 8-layer folders here first")
    parser.add_argument(
        "--alone", action="store_true", help="one folder per process, the folders taking turns"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alone and args.folders and args.processes % len(args.folders):
        parser.error(f"--alone: --processes must be a multiple of the {len(args.folders)} folders")
    named = [(label, Path(path)) for label, _, path in (f.partition("=") for f in args.folders)]
    if args.child:
        child(named, args.prompt, args.tokens, args.repeat)
        return
    if args.make:
        make(args.make)
    if not named:
        return
    import bench_generation as bg

    base = named[0][0]
    start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # one intra-op and one inter-op thread each: copies of the configs, links to the rest
        paths = {
            label: bg._one_thread_copy(folder, Path(tmp) / f"{i}") for i, (label, folder) in
            enumerate(named)
        }  # fmt: skip
        per_process = (_measure_alone if args.alone else _measure)(paths, base, args)
    end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{args.processes} processes{' (one folder each)' if args.alone else ''} x {args.repeat} rounds, prompt {args.prompt}, {args.tokens} "
        f"tokens, 1 thread, tokens per CPU second over {base}; load average {start} at start, "
        f"{end} at the end ({time.perf_counter() - began:.0f} s):"
    )
    for label, (median, low, high) in summary(per_process).items():
        print(f"  {label}: {median:.3f} [{low:.3f}, {high:.3f}]")


def _measure(paths: dict[str, Path], base: str, args: argparse.Namespace) -> list[dict[str, float]]:
    """Each process's ratios to ``base``, the processes one after the other."""
    per_process = []
    for k, labels in enumerate(orders(list(paths), args.processes)):
        rates = _rates([(label, paths[label]) for label in labels], args)
        per_process.append(ratios(rates, base))
        print(f"  process {k + 1} (order {', '.join(labels)}): "
              + ", ".join(f"{label} {r:.3f}" for label, r in per_process[-1].items()), flush=True)  # fmt: skip
    return per_process


def _rates(order: list[tuple[str, Path]], args: argparse.Namespace) -> dict[str, float]:
    """A child process's median tokens per CPU second of each folder in ``order``."""
    command = [sys.executable, __file__, "--child", *(f"{label}={p}" for label, p in order)]
    command += ["--repeat", str(args.repeat), "--tokens", str(args.tokens)]
    command += ["--prompt", str(args.prompt)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    rates: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return rates


def _measure_alone(
    paths: dict[str, Path], base: str, args: argparse.Namespace
) -> list[dict[str, float]]:
    """``--alone``: each round's ratios to ``base``, one process per folder."""
    per_round = []
    for k, labels in enumerate(alone_rounds(list(paths), args.processes)):
        rates: dict[str, float] = {}
        for label in labels:
            rates.update(_rates([(label, paths[label])], args))
        per_round.append(ratios(rates, base))
        print(f"  round {k + 1} (one process each: {', '.join(labels)}): "
              + ", ".join(f"{label} {r:.3f}" for label, r in per_round[-1].items()), flush=True)  # fmt: skip
    return per_round


if __name__ == "__main__":
    main()

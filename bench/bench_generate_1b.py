"""A Llama-3.2-1B-shaped fp32 decoder built with ``task: text-generation``: peak memory and wall time.

Optionally fused and int4, and against onnxruntime-genai's model builder on the same checkpoint
(issue 35):

    python bench/bench_generate_1b.py OUT [--dynamo] [--tokens 8] [--min-free-gib 12]
    python bench/bench_generate_1b.py OUT --fuse onnxruntime --quantize int4_block --builder
    python bench/bench_generate_1b.py OUT ... --builder --rounds 3 --drop-caches

1. A seeded random ``LlamaForCausalLM`` of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32
   heads, 8 kv heads, intermediate 8192, vocab 128256, tied embeddings, rope_theta 500000) is
   saved with ``save_pretrained`` to ``OUT/ckpt`` (about 4.9 GB, in its own process: 53 s on an
   idle machine here, 212 s on a loaded one; never committed), with a word-level
   ``tokenizer.json`` over the vocabulary (``bench_generation.py``'s ``write_tokenizer``) so
   that onnxruntime-genai's model builder can read the same folder. A folder that already holds
   ``config.json``, every safetensors file and ``tokenizer.json`` (written last) is kept.
2. A recipe (``OUT/bench_1b_generate_<path>[_fused][_int4].yaml``) loads it through
   ``hyperexport.models.pretrained`` with ``task: text-generation``, two prompts and ``--tokens``
   new tokens. ``--fuse onnxruntime`` adds ``attention: {implementation: hyperexport}`` and
   ``rewrite: {fuse: onnxruntime}``; ``--quantize int4_block`` adds ``quantize: {method:
   int4_block, block_size: --block-size, accuracy_level: --accuracy-level, symmetric:
   --symmetric, shared_embedding: --shared-embedding}`` and makes the quantized gates report-only (``check.quantized``: ``decode: report``, ``min_cosine`` and
   ``min_top1`` 0, ``max_rel_error`` 1e6): on random weights the int4 model's agreement with
   the float one means nothing.
3. ``python -m hyperexport recipe_file=...`` builds it (trace, export, rewrite, quantize,
   evaluate, check) in one child process under ``memwatch.py``, with an emptied cache and
   outputs folder (then ``os.sync``, as before each builder run): wall time, CPU seconds of the
   process tree, peak anonymous memory and peak RSS (summed over the tree, sampled), with the
   load average before and after. The stages' wall times come from
   the published ``report.json``. **Start-up to the quantized model** is the build's wall minus
   its evaluate and check stages: everything from process start until quantize ends (the
   interpreter's start-up and imports, trace, export, rewrite, quantize and the runner's work
   between them; it also holds the publishing after check, which ``report.json`` does not time).
   Without ``--quantize`` the quantize stage does nothing and the figure ends at the float model.
   **Unverified, to the quantized model** is that minus the verification the trace does while it
   has the live model (the ``reference decode`` span of ``report.json``: transformers' greedy
   decode of the prompts, which evaluate's generation check compares with). The builder verifies
   nothing, so this is the figure to set against its wall; both are printed.
4. With ``--builder``, after our build: onnxruntime-genai's model builder on the same checkpoint
   under ``memwatch.py``, ``-p int4 -e cpu`` (``--extra_options block_size=--block-size
   accuracy_level=--accuracy-level is_symmetric=--symmetric``: the same int4 layout as ours)
   then ``-p fp32 -e cpu``, each into an emptied folder, and a table: wall, CPU and peaks of each, and the ratio of our start-up-to-quantized wall to the
   builder's int4 wall (and to its fp32 wall when not quantizing). The builder verifies nothing.

All runs are one after the other in one invocation, ours first. ``--rounds N`` repeats the
three, alternating, and adds each ratio's median and range over the rounds. ``--drop-caches``
(root only) empties the page cache before each run and reads the checkpoint back in, so that
no run pays for reclaiming what an earlier one left cached (``settle``). The last line printed
is one JSON object with every figure (for ``bench/README.md``); its top-level ``ours``,
``builder`` and ``ratios`` are the first round's.

The build must pass the generation check: onnxruntime-genai's greedy decode of the float model
equals transformers' ``generate`` token for token (``generation_check.json``, asserted here).
Before each build the script waits until ``MemAvailable`` reaches ``--min-free-gib`` (checking
every 30 s): the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from memwatch import run as watch

SHAPE = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

PROMPTS = [[17, 93, 41, 8, 120, 66, 5], [71, 30, 99, 12]]

#: ``--fuse`` and ``--quantize`` values (``rewrite.fuse`` and ``quantize.method`` of the recipe).
FUSIONS = ("none", "onnxruntime")
QUANTIZATIONS = ("none", "int4_block")

#: The stages in ``report.json``, in order; evaluate and check come after the quantized model.
STAGES = ("trace", "export", "rewrite", "quantize", "evaluate", "check")
AFTER_THE_MODEL = ("evaluate", "check")
#: Verification the stages before the quantized model do where the live model is: ``report.json``
#: spans (the trace's transformers decode, which the generation check compares with).
VERIFICATION_SPANS = ("reference decode",)

_WRITE_CHECKPOINT = """
import sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
sys.path.insert(0, {bench!r})
from bench_generation import write_tokenizer
config = LlamaConfig(**{shape!r})
torch.manual_seed({seed})
model = LlamaForCausalLM(config).to(torch.float32)
model.save_pretrained({out!r})
write_tokenizer(Path({out!r}), config.vocab_size)
"""

# Random weights: the int4 model's agreement with the float one means nothing (cosine 0.81 over
# 16 layers, as the builder's int4 on such weights), so nothing of it is gated as far as the
# schema allows: min_cosine and min_top1 in [0, 1] (a negative cosine would still fail),
# max_rel_error > 0 (a large finite value: JSON, which the cache keys hash, has no infinity).
_REPORT_ONLY = (
    "check: {quantized: {min_cosine: 0.0, max_rel_error: 1000000.0, min_top1: 0.0,"
    " decode: report}}\n"
)


@dataclass(frozen=True)
class RecipeOptions:
    """What the recipe sets beyond the checkpoint: the export path, the decode, fusion, int4."""

    dynamo: bool = False
    tokens: int = 8
    fuse: str = "none"
    quantize: str = "none"
    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = False
    shared_embedding: bool = False

    @property
    def tag(self) -> str:
        """``torchscript`` or ``dynamo``, then ``_fused`` and ``_int4`` when set."""
        tag = "dynamo" if self.dynamo else "torchscript"
        tag += "_fused" if self.fuse != "none" else ""
        return tag + ("_int4" if self.quantize != "none" else "")


def _available_gib() -> float:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_memory(min_gib: float, timeout: float = 3600.0) -> float:
    """Block until ``MemAvailable`` is at least ``min_gib``; return it. Gives up after ``timeout``."""
    started = time.monotonic()
    while (free := _available_gib()) < min_gib:
        if time.monotonic() - started > timeout:
            raise SystemExit(f"only {free:.1f} GiB available after {timeout:.0f} s; not starting")
        print(f"{free:.1f} GiB available (< {min_gib}); waiting 30 s", flush=True)
        time.sleep(30)
    return free


def checkpoint_complete(folder: Path) -> bool:
    """``config.json``, every safetensors file the folder names, and ``tokenizer.json`` exist."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = set(json.loads(index.read_text())["weight_map"].values())
    else:
        shards = {"model.safetensors"}
    names = ("config.json", "tokenizer.json", *sorted(shards))
    return all((folder / name).is_file() for name in names)


def write_checkpoint(folder: Path, seed: int) -> None:
    """Save the random 1B-shaped checkpoint (and a tokenizer) in a child process, unless the
    folder already holds a complete one (:func:`checkpoint_complete`)."""
    if checkpoint_complete(folder):
        print(f"checkpoint exists: {folder}")
        return
    code = _WRITE_CHECKPOINT.format(
        bench=str(Path(__file__).parent), shape=SHAPE, seed=seed, out=str(folder)
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    print(f"checkpoint written in {time.perf_counter() - started:.0f} s: {folder}")


def recipe_text(name: str, checkpoint: Path, options: RecipeOptions) -> str:
    """The recipe's YAML; with no fusion and no quantization, the script's recipe as it was."""
    text = (
        "# @package _global_\n"
        f"name: {name}\n"
        f"model: {{_target_: hyperexport.models.pretrained, path: {checkpoint},"
        " auto_class: AutoModelForCausalLM}\n"
        "inputs: auto\nhiera: auto\ntask: text-generation\nfunctions: per_type\nexternal_data: true\n"
        f"dynamo: {str(options.dynamo).lower()}\n"
        f"generation: {{prompts: {PROMPTS}, max_new_tokens: {options.tokens}}}\n"
    )
    if options.fuse != "none":
        text += "attention: {implementation: hyperexport}\n"
        text += f"rewrite: {{fuse: {options.fuse}}}\n"
    if options.quantize != "none":
        text += (
            f"quantize: {{method: {options.quantize}, block_size: {options.block_size},"
            f" accuracy_level: {options.accuracy_level},"
            f" symmetric: {str(options.symmetric).lower()},"
            f" shared_embedding: {str(options.shared_embedding).lower()}}}\n"
        )
        text += _REPORT_ONLY
    return text


def write_recipe(path: Path, checkpoint: Path, options: RecipeOptions) -> None:
    path.write_text(recipe_text(path.stem, checkpoint, options))


def stage_seconds(report: Path) -> dict[str, float]:
    """``{stage: wall seconds}`` from a build's ``report.json`` ({} if the build wrote none)."""
    if not report.exists():
        return {}
    return {s["name"]: float(s["seconds"]) for s in json.loads(report.read_text())["stages"]}


def startup_to_model(wall: float, stages: dict[str, float]) -> float:
    """The build's wall minus evaluate and check: from process start until quantize ends."""
    return wall - sum(stages.get(name, 0.0) for name in AFTER_THE_MODEL)


def verification_before_model(report: Path) -> float:
    """Seconds of :data:`VERIFICATION_SPANS` in the stages before evaluate (0 without a report)."""
    if not report.exists():
        return 0.0
    return sum(
        float(seconds)
        for stage in json.loads(report.read_text())["stages"]
        if stage["name"] not in AFTER_THE_MODEL
        for name, seconds in (stage.get("spans") or {}).items()
        if name in VERIFICATION_SPANS
    )


def check_generation(folder: Path) -> None:
    """Assert the float model's generation check passed; print its sequences and genai config."""
    genai = json.loads((folder / "genai_config.json").read_text())["model"]
    report = json.loads((folder / "generation_check.json").read_text())
    assert report["passed"], report
    for seq in report["sequences"]:
        print(
            f"  tokens {seq['exported']} (reference {seq['reference']}), "
            f"max logits diff {max(seq['max_diff_per_step']):.2e}, "
            f"min top-2 gap {seq['min_top2_gap']:.2e}"
        )
    print(f"  genai_config: type {genai['type']}, layers {genai['decoder']['num_hidden_layers']}")


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def settle(checkpoint: Path, drop_caches: bool) -> None:
    """Before each run: let the disk's writeback finish (``os.sync``); with ``drop_caches``,
    also empty the page cache and read the checkpoint back in, so that every run starts from
    the same memory: the checkpoint cached, nothing else. (A page cache full of an earlier
    run's files makes this machine reclaim as it writes: the kernel copy of 4.9 GB took 2.1 to
    2.8 s with the cache emptied, 10.5 s with it full; see ``bench/README.md``.)"""
    os.sync()
    if not drop_caches:
        return
    DROP_CACHES.write_text("1\n")
    for f in sorted(checkpoint.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def build_ours(
    out: Path, recipe: Path, tag: str, checkpoint: Path, drop_caches: bool
) -> dict[str, Any]:
    """``python -m hyperexport`` on ``recipe`` under memwatch, from an emptied cache: the
    figures, the stages' seconds and start-up to the model; asserts the build passed."""
    cache = out / f"cache_{tag}"
    command = [
        sys.executable,
        "-m",
        "hyperexport",
        f"recipe_file={recipe}",
        f"build.cache_dir={cache}",
        f"build.outputs_dir={out / 'out'}",
    ]
    print(f"load {_load()}: {' '.join(command)}", flush=True)
    # A cold build, not a cache hit, into an emptied folder as the builder's: a previous
    # publication would be replaced inside the timed window (its files deleted there). Then the
    # disk's writeback of what was deleted and written before is let finish, for both runs.
    for folder in (cache, out / "out" / recipe.stem):
        if folder.exists():
            shutil.rmtree(folder)
    settle(checkpoint, drop_caches)
    figures = watch(command)
    published = (
        out / "out" / recipe.stem / ("default" if figures["exit"] == 0 else "default.failed")
    )
    stages = stage_seconds(published / "report.json")
    start = startup_to_model(figures["wall_s"], stages)
    verification = verification_before_model(published / "report.json")
    figures.update(
        stages=stages,
        startup_to_model_s=round(start, 2),
        verification_before_model_s=round(verification, 2),
        unverified_to_model_s=round(start - verification, 2),
    )
    print(
        "  stages: "
        + ", ".join(f"{name} {stages.get(name, 0.0):.1f} s" for name in STAGES)
        + f"; start-up to the quantized model {start:.1f} s, of which verification"
        f" (the reference decode) {verification:.1f} s",
        flush=True,
    )
    assert figures["exit"] == 0, f"the build failed (exit {figures['exit']}): {published}"
    check_generation(published)
    return figures


def builder_command(
    checkpoint: Path, out: Path, precision: str, options: RecipeOptions
) -> list[str]:
    """onnxruntime-genai's model builder on ``checkpoint`` for the CPU at ``precision``; int4 in
    blocks of ``options.block_size`` at ``options.accuracy_level``, symmetric as
    ``options.symmetric`` says, so that both int4 models have the same layout (the builder's CPU
    defaults are 32, 4 and symmetric, passed anyway)."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder"]
    command += ["-i", str(checkpoint), "-o", str(out / f"builder_{precision}"), "-p", precision]
    command += ["-e", "cpu", "-c", str(out / f"builder_cache_{precision}")]
    if precision == "int4":
        command += [
            "--extra_options",
            f"block_size={options.block_size}",
            f"accuracy_level={options.accuracy_level}",
            f"is_symmetric={str(options.symmetric).lower()}",
        ]
    return command


def run_builder(
    checkpoint: Path, out: Path, precision: str, options: RecipeOptions, drop_caches: bool
) -> dict[str, Any]:
    """The builder at ``precision`` under memwatch, into emptied folders; asserts it exits 0."""
    for folder in (out / f"builder_{precision}", out / f"builder_cache_{precision}"):
        if folder.exists():
            shutil.rmtree(folder)
    settle(checkpoint, drop_caches)
    command = builder_command(checkpoint, out, precision, options)
    print(f"load {_load()}: {' '.join(command)}", flush=True)
    figures = watch(command)
    assert figures["exit"] == 0, f"the builder failed at {precision} (exit {figures['exit']})"
    return figures


def ratios(
    ours: dict[str, Any], builders: dict[str, dict[str, Any]], quantized: bool
) -> dict[str, float]:
    """Our start-up-to-model wall over the builder's int4 wall (and fp32's when not quantizing),
    with and without the verification done before the model (the builder verifies nothing)."""
    against = ("int4",) if quantized else ("int4", "fp32")
    return {
        f"{figure}_over_builder_{p}": round(ours[f"{figure}_s"] / builders[p]["wall_s"], 3)
        for figure in ("startup_to_model", "unverified_to_model")
        for p in against
        if p in builders and f"{figure}_s" in ours
    }


def print_table(
    ours: dict[str, Any], builders: dict[str, dict[str, Any]], weights_gb: float
) -> None:
    """One row per run: wall (ours: start-up to the model too), CPU and both peaks."""
    print("| run | start-up to the model | wall | CPU | written | peak anonymous | peak RSS |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = {"ours": ours, **{f"builder {p}": f for p, f in builders.items()}}
    for name, f in rows.items():
        start = f.get("startup_to_model_s", f["wall_s"])
        print(
            f"| {name} | {start:.1f} s | {f['wall_s']:.1f} s | {f['cpu_s']:.0f} s "
            f"| {f.get('written_gb', float('nan')):.1f} GB "
            f"| {f['peak_anon_gb']:.2f} GB = {f['peak_anon_gb'] / weights_gb:.2f}x "
            f"| {f['peak_rss_gb']:.2f} GB = {f['peak_rss_gb'] / weights_gb:.2f}x |"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dynamo", action="store_true")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-free-gib", type=float, default=12.0)
    parser.add_argument("--fuse", choices=FUSIONS, default="none", help="rewrite.fuse")
    parser.add_argument("--quantize", choices=QUANTIZATIONS, default="none", help="quantize.method")
    parser.add_argument("--block-size", type=int, default=32, help="int4: K elements per block")
    parser.add_argument(
        "--accuracy-level", type=int, choices=range(5), default=4, help="int4: MatMulNBits'"
    )
    parser.add_argument(
        "--symmetric",
        action="store_true",
        help="int4: quantize.symmetric (no zero points), and the builder's is_symmetric to match",
    )
    parser.add_argument(
        "--shared-embedding",
        action="store_true",
        help="int4: quantize.shared_embedding (the builder's shared_embeddings, its default on "
        "tied models)",
    )
    parser.add_argument(
        "--builder", action="store_true", help="then onnxruntime-genai's builder, int4 and fp32"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat ours and the builder's runs, alternating; the ratios' median and range",
    )
    parser.add_argument(
        "--drop-caches",
        action="store_true",
        help=f"before each run, empty the page cache ({DROP_CACHES}, root only) and read the "
        "checkpoint back in",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        parser.error(f"--drop-caches: {DROP_CACHES} is not writable here (it needs root)")
    return args


def recipe_options(args: argparse.Namespace) -> RecipeOptions:
    """The recipe's settings from the command line."""
    return RecipeOptions(
        args.dynamo,
        args.tokens,
        args.fuse,
        args.quantize,
        args.block_size,
        args.accuracy_level,
        args.symmetric,
        args.shared_embedding,
    )


def built_code() -> str:
    """The hyperexport the build's ``python -m hyperexport`` imports, and its commit.

    It runs in this process's working directory, which ``python -m`` puts first on the path,
    before ``PYTHONPATH`` and the installed package: to build another tree's code, run this
    script from that tree.
    """
    where = subprocess.run(
        [sys.executable, "-c", "import hyperexport; print(hyperexport.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    folder = Path(where).parent.parent
    commit = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{folder} at {commit or 'no git commit'}"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    options = recipe_options(args)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "ckpt"
    wait_for_memory(args.min_free_gib)
    write_checkpoint(checkpoint, args.seed)
    recipe = out / f"bench_1b_generate_{options.tag}.yaml"
    write_recipe(recipe, checkpoint, options)
    weights_gb = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / 1e9
    load_before = _load()
    code = built_code()
    rounds = [
        one_round(args, options, out, recipe, checkpoint, weights_gb, code)
        for _ in range(args.rounds)
    ]
    summary = {
        "options": asdict(options),
        "recipe": str(recipe),
        "code": code,
        "weights_gb": round(weights_gb, 3),
        "drop_caches": args.drop_caches,
        "load_before": load_before,
        "load_after": _load(),
        **rounds[0],
        "rounds": rounds,
        "ratio_medians": {
            name: {
                "median": statistics.median(r["ratios"][name] for r in rounds),
                "range": [
                    min(r["ratios"][name] for r in rounds),
                    max(r["ratios"][name] for r in rounds),
                ],
            }
            for name in rounds[0]["ratios"]
        },
    }
    if args.rounds > 1:
        for name, m in summary["ratio_medians"].items():
            print(
                f"{name}: median {m['median']:.2f}x over {args.rounds} rounds, range {m['range'][0]:.2f} to {m['range'][1]:.2f}"
            )
    print(json.dumps(summary), flush=True)


def one_round(
    args: argparse.Namespace,
    options: RecipeOptions,
    out: Path,
    recipe: Path,
    checkpoint: Path,
    weights_gb: float,
    code: str,
) -> dict[str, Any]:
    """Our build, then (with ``--builder``) the builder's int4 and fp32 runs: their figures
    and ratios, printed as they come."""
    free = wait_for_memory(args.min_free_gib)
    load_before = _load()
    print(f"{free:.1f} GiB available, load {load_before}; building with {code}", flush=True)
    ours = build_ours(out, recipe, options.tag, checkpoint, args.drop_caches)
    print(
        f"{options.tag}: wall {ours['wall_s']:.0f} s, CPU {ours['cpu_s']:.0f} s, "
        f"peak anonymous {ours['peak_anon_gb']:.2f} GB, peak RSS {ours['peak_rss_gb']:.2f} GB "
        f"({ours['peak_rss_gb'] / weights_gb:.2f}x the {weights_gb:.2f} GB of weights; "
        f"largest process {ours['maxrss_gb']:.2f} GB), load before {load_before}, after {_load()}",
        flush=True,
    )
    builders: dict[str, dict[str, Any]] = {}
    if args.builder:
        for precision in ("int4", "fp32"):
            wait_for_memory(args.min_free_gib)
            builders[precision] = run_builder(checkpoint, out, precision, options, args.drop_caches)
        print_table(ours, builders, weights_gb)
    found = ratios(ours, builders, options.quantize != "none")
    for name, ratio in found.items():
        print(f"{name}: {ratio:.2f}x")
    return {"ours": ours, "builder": builders, "ratios": found}


if __name__ == "__main__":
    main()

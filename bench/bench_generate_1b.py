"""A Llama-3.2-1B-shaped fp32 decoder built with ``task: text-generation``: peak memory and wall time.

    python bench/bench_generate_1b.py OUT [--dynamo] [--tokens 8] [--min-free-gib 12]

1. A seeded random ``LlamaForCausalLM`` of Llama-3.2-1B's shape (hidden 2048, 16 layers, 32
   heads, 8 kv heads, intermediate 8192, vocab 128256, tied embeddings, rope_theta 500000) is
   saved with ``save_pretrained`` to ``OUT/ckpt`` (about 4.9 GB, in its own process; never
   committed), with a word-level ``tokenizer.json`` over the vocabulary (``bench_generation.py``'s
   ``write_tokenizer``) so that onnxruntime-genai's model builder can read the same folder.
2. A recipe (``OUT/bench_1b_generate.yaml``) loads it through ``hyperexport.models.pretrained``
   with ``task: text-generation``, two prompts and ``--tokens`` new tokens.
3. ``python -m hyperexport recipe_file=...`` builds it (trace, export, rewrite, evaluate,
   check) in one child process, under a fresh (emptied) cache: the figures are its wall time
   and its peak RSS (``ru_maxrss`` of that child, from ``os.wait4``: its RSS high-water mark),
   its CPU time (user + system), with the load average before and after.

The build must pass the generation check: onnxruntime-genai's greedy decode equals
transformers' ``generate`` token for token (``generation_check.json``, asserted here).
Before the build the script waits until ``MemAvailable`` reaches ``--min-free-gib`` (checking
every 30 s): the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

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


def write_checkpoint(folder: Path, seed: int) -> None:
    """Save the random 1B-shaped checkpoint (and a tokenizer) in a child process."""
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        print(f"checkpoint exists: {folder}")
        return
    code = _WRITE_CHECKPOINT.format(
        bench=str(Path(__file__).parent), shape=SHAPE, seed=seed, out=str(folder)
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    print(f"checkpoint written in {time.perf_counter() - started:.0f} s: {folder}")


def write_recipe(path: Path, checkpoint: Path, dynamo: bool, tokens: int) -> None:
    path.write_text(
        "# @package _global_\n"
        f"name: {path.stem}\n"
        f"model: {{_target_: hyperexport.models.pretrained, path: {checkpoint},"
        " auto_class: AutoModelForCausalLM}\n"
        "inputs: auto\nhiera: auto\ntask: text-generation\nfunctions: per_type\nexternal_data: true\n"
        f"dynamo: {str(dynamo).lower()}\n"
        f"generation: {{prompts: {PROMPTS}, max_new_tokens: {tokens}}}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--dynamo", action="store_true")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-free-gib", type=float, default=12.0)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "ckpt"
    wait_for_memory(args.min_free_gib)
    write_checkpoint(checkpoint, args.seed)
    path = "dynamo" if args.dynamo else "torchscript"
    recipe = out / f"bench_1b_generate_{path}.yaml"
    write_recipe(recipe, checkpoint, args.dynamo, args.tokens)
    free = wait_for_memory(args.min_free_gib)
    load_before = _load()
    command = [
        sys.executable,
        "-m",
        "hyperexport",
        f"recipe_file={recipe}",
        f"build.cache_dir={out / f'cache_{path}'}",
        f"build.outputs_dir={out / 'out'}",
    ]
    print(f"{free:.1f} GiB available, load {load_before}: {' '.join(command)}", flush=True)
    cache = out / f"cache_{path}"
    if cache.exists():
        shutil.rmtree(cache)  # a cold build, not a cache hit
    started = time.perf_counter()
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    child.returncode = code
    peak = usage.ru_maxrss / (1 << 20)  # KiB -> GiB, this child only
    folder = out / "out" / recipe.stem / "default"
    weights = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) / (1 << 30)
    print(
        f"{path}: exit {code}, wall {wall:.0f} s, CPU {usage.ru_utime + usage.ru_stime:.0f} s, "
        f"peak RSS {peak:.2f} GiB "
        f"({peak / weights:.2f}x the {weights:.2f} GiB of weights), "
        f"load before {load_before}, after {_load()}"
    )
    assert code == 0, f"the build failed (exit {code})"
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


if __name__ == "__main__":
    main()

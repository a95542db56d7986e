"""Tokens per second in onnxruntime-genai, one thread: hierarchical vs flat, same KV model.

Both models are the same ``CausalLMStep`` of a seeded random Llama (onnxruntime-genai's names,
past/present KV, dynamic batch/sequence/past) exported on the TorchScript path:

* **hierarchical**: ``export_hyper_onnx`` with ``hiera=[KVStep]`` (each decoder layer one
  function, per_type), as ``task: text-generation`` builds it;
* **flat**: a plain ``torch.onnx.export(dynamo=False)`` of the same step model (no functions);
* **fused** (with ``--fuse``): the hierarchical model with ``attention.implementation:
  hyperexport`` and ``rewrite.fuse: onnxruntime`` (GroupQueryAttention over the past,
  RotaryEmbedding, SkipSimplifiedLayerNormalization inside the layer function; the pasts are
  onnxruntime-genai's shared buffers, ``past_present_share_buffer: true``), and **fused int4**,
  that model quantized as ``quantize.method=int4_block`` does (``MatMulNBits`` in the function,
  blocks of 32, ``accuracy_level`` 4, the builder's CPU settings);
* **builder fp32 / int4** (with ``--builder fp32 int4``, a reference figure): onnxruntime-genai's
  own model builder (``python -m onnxruntime_genai.models.builder -e cpu``) run on the same
  checkpoint, saved with ``save_pretrained`` and a word-level ``tokenizer.json`` over the
  vocabulary (the builder reads a tokenizer; built offline with ``tokenizers``). Its graph is
  flat and fused (GroupQueryAttention, SkipSimplifiedLayerNormalization, a shared KV buffer).

Each of our folders gets the same ``genai_config.json``; every folder's session options are set
to one intra-op and one inter-op thread. A run is one greedy decode: a ``--prompt``-token
prompt, then ``--tokens`` new tokens; runs alternate between the folders and the median
tokens/s of each is reported, with its ratio to the flat model, both per wall second and per CPU
second of the decode (``time.process_time``; read that one on a loaded machine). With ``--profile``
each folder is then decoded once more under onnxruntime's profiler, and the kernels it ran per
step are printed, in all and per operator. Our two decodes must agree token
for token (asserted); the builder fp32's agreement is printed (its fused kernels sum in another
order, so a near-tie may flip a token; int4 is not expected to agree).

    python bench/bench_generation.py --layers 8 --hidden 256 --repeat 7 --builder fp32 int4
    python bench/bench_generation.py --tokens 64 --repeat 21 --builder fp32 int4 --fuse --profile
    python bench/bench_generation.py --ours OUT/out/bench_1b_generate_torchscript/default \
        --checkpoint OUT/ckpt --tokens 32 --repeat 3 --builder fp32

The second compares the Llama-3.2-1B-shaped build of ``bench_generate_1b.py OUT`` with the
builder's model of the same checkpoint (no flat export there: a flat TorchScript export of that
size needs about 4x the weights in memory).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _model(layers: int, hidden: int, vocab: int) -> Any:
    from hyperexport.zoo import random_transformer

    return random_transformer(
        "LlamaForCausalLM",
        dict(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=hidden * 4,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 32,
            num_key_value_heads=hidden // 64,
            max_position_embeddings=2048,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        seed=0,
    )


def _inputs(config: dict[str, Any], dtype: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from hyperexport.library.models.inputs import make_inputs
    from hyperexport.library.tasks.causal_lm import step_inputs

    specs = step_inputs(config, dtype)
    return make_inputs(specs), specs


def export_both(model: Any, folder: Path, fuse: bool = False) -> dict[str, Path]:
    """Export the hierarchical and the flat step model into ``folder/hier`` and ``folder/flat``
    (and, with ``fuse``, the fused hierarchical one into ``folder/fused``)."""
    from hyperexport import AttentionOptions, ExportOptions, RewriteOptions, export_hyper_onnx
    from hyperexport.library.tasks.genai_config import build_genai_config
    from hyperexport.library.tasks.steps import CausalLMStep
    from hyperexport.transformers.kv_layers import KVStep, explicit_kv_layers

    config = model.config.to_dict()
    kwargs, specs = _inputs(config, "float32")
    axes = {name: dict(spec["dynamic"]) for name, spec in specs.items()}
    probe = tuple((name, tuple(spec["check_shape"])) for name, spec in specs.items())
    step = CausalLMStep(model).eval()
    genai = build_genai_config(config, model_file="model.onnx")
    genai["model"]["decoder"]["session_options"].update(
        {"intra_op_num_threads": 1, "inter_op_num_threads": 1}
    )
    hier, flat, fused = folder / "hier", folder / "flat", folder / "fused"
    variants = {hier: ExportOptions(functions="per_type", probe_shapes=probe)}
    if fuse:
        variants[fused] = ExportOptions(
            functions="per_type",
            probe_shapes=probe,
            attention=AttentionOptions("hyperexport"),
            rewrite=RewriteOptions(fuse="onnxruntime"),
            context_length=model.config.max_position_embeddings,
        )
    # The fused model's pasts are onnxruntime-genai's shared buffers (passes/share_kv_buffer.py).
    shared = json.loads(json.dumps(genai))
    shared["search"]["past_present_share_buffer"] = True
    for target in (*variants, flat):
        target.mkdir(parents=True)
        config = shared if target == fused else genai
        (target / "genai_config.json").write_text(json.dumps(config))
    with explicit_kv_layers(model):
        for target, options in variants.items():
            export_hyper_onnx(
                step,
                (kwargs,),
                str(target / "model.onnx"),
                hiera=[KVStep],
                dynamo=False,
                dynamic_axes=axes,
                options=options,
            )
    names = list(specs)
    outputs = ["logits"] + [
        f"present.{i}.{k}" for i in range(model.config.num_hidden_layers) for k in ("key", "value")
    ]
    flat_axes = dict(axes)
    for name in outputs[1:]:
        flat_axes[name] = {0: "batch", 2: "total_sequence_length"}
    flat_axes["logits"] = {0: "batch", 1: "sequence_length"}
    torch.onnx.export(
        step,
        (kwargs,),
        str(flat / "model.onnx"),
        input_names=names,
        output_names=outputs,
        dynamic_axes=flat_axes,
        opset_version=18,
        dynamo=False,
    )
    if not fuse:
        return {"hierarchical": hier, "flat": flat}
    fused_int4, symmetric = folder / "fused_int4", folder / "fused_int4_symmetric"
    quantize_fused(fused, fused_int4, shared, symmetric=False)
    quantize_fused(fused, symmetric, shared, symmetric=True)
    return {
        "hierarchical": hier,
        "flat": flat,
        "fused": fused,
        "fused int4": fused_int4,
        "fused int4 symmetric": symmetric,
    }


def quantize_fused(fused: Path, target: Path, genai: dict[str, Any], symmetric: bool) -> None:
    """The fused model quantized as ``quantize.method=int4_block`` does (blocks of 32, the
    builder's CPU ``accuracy_level`` 4; ``symmetric``: ``quantize.symmetric``, the builder's
    layout), into ``target`` with the same genai config."""
    from hyperexport.library.model_file import load_model, save_model
    from hyperexport.library.passes.quantize_matmul import QuantizeMatMulsPass

    model = load_model(fused / "model.onnx")
    QuantizeMatMulsPass("int4_block", 32, (), 4, symmetric)(model)
    target.mkdir(parents=True)
    save_model(model, target / "model.onnx", external_data=True)
    (target / "genai_config.json").write_text(json.dumps(genai))


def write_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level ``tokenizer.json`` (``t<i>`` -> i; 0/1/2 pad/bos/eos) for the builder to read."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab)}
    words.update({"<pad>": 0, "<s>": 1, "</s>": 2})
    del words["t0"], words["t1"], words["t2"]
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t3"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "t3",
                "model_max_length": 4096,
            }
        )
    )


def one_thread(folder: Path) -> None:
    """Set the folder's decoder session options to one intra-op and one inter-op thread."""
    path = folder / "genai_config.json"
    genai = json.loads(path.read_text())
    genai["model"]["decoder"].setdefault("session_options", {}).update(
        {"intra_op_num_threads": 1, "inter_op_num_threads": 1}
    )
    path.write_text(json.dumps(genai, indent=1))


def build_with_builder(checkpoint: Path, folder: Path, precision: str) -> Path:
    """onnxruntime-genai's model builder on ``checkpoint`` (CPU, ``precision``) into ``folder``."""
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(checkpoint),
        "-o",
        str(folder),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(folder.parent / f"builder_cache_{precision}"),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the builder failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    one_thread(folder)
    share = json.loads((folder / "genai_config.json").read_text())["search"]
    print(
        f"builder {precision}: {time.perf_counter() - started:.0f} s, "
        f"past_present_share_buffer {share.get('past_present_share_buffer')}",
        flush=True,
    )
    return folder


def _one_thread_copy(folder: Path, target: Path) -> Path:
    """``target`` with links to ``folder``'s files and a one-thread copy of its genai_config."""
    target.mkdir()
    for item in folder.iterdir():
        if item.name != "genai_config.json":
            (target / item.name).symlink_to(item.resolve())
    (target / "genai_config.json").write_text((folder / "genai_config.json").read_text())
    one_thread(target)
    return target


def decode(
    folder: Path, prompt: list[int], tokens: int, model: Any = None
) -> tuple[float, float, list[int]]:
    """Tokens per second of one greedy decode in onnxruntime-genai (wall, CPU), and the tokens.

    The CPU figure is tokens over the process's CPU time (``time.process_time``, every thread)
    during the decode: on a loaded machine other processes barely move it. ``model``: the
    folder's ``og.Model`` already loaded (a warm session, as a server decodes); by default a
    fresh one, so the decode's first steps pay the new session's first runs.
    """
    import onnxruntime_genai as og

    model = model if model is not None else og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = len(prompt) + tokens  # min_length too: every run decodes exactly ``tokens``
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    started, cpu = time.perf_counter(), time.process_time()
    generator.append_tokens(np.asarray([prompt], dtype=np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    sequence = [int(t) for t in generator.get_sequence(0)][len(prompt) :]
    return len(sequence) / seconds, len(sequence) / cpu, sequence


def _loaded(folder: Path) -> Any:
    """The folder's model in onnxruntime-genai, loaded once."""
    import onnxruntime_genai as og

    return og.Model(str(folder))


def profile_kernels(folder: Path, prompt: list[int], tokens: int, out: Path) -> dict[str, Any]:
    """One decode of a copy of ``folder`` with onnxruntime's profiler on (``enable_profiling``
    in the genai config's session options): kernels per step, in all and per operator."""
    import collections
    import shutil

    target = out / f"profiled_{folder.name}"
    shutil.copytree(folder, target, symlinks=True)
    path = target / "genai_config.json"
    genai = json.loads(path.read_text())
    prefix = out / f"profile_{folder.name}"
    genai["model"]["decoder"].setdefault("session_options", {})["enable_profiling"] = str(prefix)
    path.write_text(json.dumps(genai))
    decode(target, prompt, tokens)
    [trace] = sorted(out.glob(f"{prefix.name}*.json"))[-1:]
    events = json.loads(trace.read_text())
    steps = sum(1 for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    ops = collections.Counter(
        e["args"]["op_name"]
        for e in events
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    )
    return {
        "kernels_per_step": sum(ops.values()) / steps,
        "per_op": {op: n / steps for op, n in ops.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--builder",
        nargs="*",
        default=[],
        choices=["fp32", "int4"],
        help="also onnxruntime-genai's model builder at these precisions (reference figures)",
    )
    parser.add_argument(
        "--ours",
        type=Path,
        help="instead of exporting: an output folder of a text-generation build (ours, "
        "hierarchical), compared with the builder on --checkpoint (no flat export: at 1B a flat "
        "TorchScript export needs ~4x the weights in memory)",
    )
    parser.add_argument("--checkpoint", type=Path, help="with --ours: its checkpoint folder")
    parser.add_argument(
        "--fuse",
        action="store_true",
        help="also the hierarchical model with rewrite.fuse=onnxruntime",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="load each folder's model once and decode every round on it (a server's way); "
        "by default every decode loads the model afresh and pays its first runs",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed rounds, one profiled decode per folder: kernels per step",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    with tempfile.TemporaryDirectory() as tmp:
        if args.ours:
            folders = {"hierarchical": _one_thread_copy(args.ours, Path(tmp) / "ours")}
            checkpoint = args.checkpoint
            vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
        else:
            model = _model(args.layers, args.hidden, args.vocab)
            folders = export_both(model, Path(tmp), fuse=args.fuse)
            checkpoint = Path(tmp) / "ckpt"
            vocab = args.vocab
            if args.builder:
                model.save_pretrained(checkpoint)
                write_tokenizer(checkpoint, args.vocab)
            del model
        for precision in args.builder:
            folders[f"builder {precision}"] = build_with_builder(
                checkpoint, Path(tmp) / f"builder_{precision}", precision
            )
        prompt = [int(t) for t in np.random.default_rng(0).integers(3, vocab, args.prompt)]
        rates: dict[str, list[float]] = {label: [] for label in folders}
        cpu_rates: dict[str, list[float]] = {label: [] for label in folders}
        seen: dict[str, list[int]] = {}
        models = {
            label: _loaded(folder) if args.warm else None for label, folder in folders.items()
        }
        for label, folder in folders.items():
            decode(folder, prompt, 4, models[label])  # warm-up (session creation paths)
        load.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
        for _ in range(args.repeat):
            for label, folder in folders.items():
                rate, cpu_rate, sequence = decode(folder, prompt, args.tokens, models[label])
                rates[label].append(rate)
                cpu_rates[label].append(cpu_rate)
                seen[label] = sequence
        models.clear()  # the sessions go before their folders do
        if "flat" in seen:
            assert seen["hierarchical"] == seen["flat"], "the two models decode differently"
        load.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
        profiles = {
            label: profile_kernels(folder, prompt, args.tokens, Path(tmp))
            for label, folder in (folders.items() if args.profile else ())
        }
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_rates.items()}
    base = "flat" if "flat" in med else "hierarchical"
    shape = f"{args.ours}" if args.ours else f"layers {args.layers}, hidden {args.hidden}"
    print(
        f"{shape}, vocab {vocab}, prompt {args.prompt}, {args.tokens} tokens, 1 thread, median "
        f"of {args.repeat}{', each model loaded once' if args.warm else ''}; load average (1/5/15 min) at start {load[0]}, before the decodes "
        f"{load[1]}, after {load[2]}:"
    )
    for label, value in med.items():
        same = sum(a == b for a, b in zip(seen[label], seen[base], strict=False))
        print(
            f"  {label}: {value:.2f} tokens/s (wall), / {base} {value / med[base]:.3f}; "
            f"{cpu_med[label]:.2f} tokens/CPU-s, / {base} {cpu_med[label] / cpu_med[base]:.3f} "
            f"(same tokens as {base}: {same}/{len(seen[base])})"
        )
    for label, profile in profiles.items():
        top = ", ".join(f"{op} {n:g}" for op, n in list(profile["per_op"].items())[:8])
        print(f"  {label}: {profile['kernels_per_step']:g} kernels per step ({top}, ...)")


if __name__ == "__main__":
    main()

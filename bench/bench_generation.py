"""Tokens per second in onnxruntime-genai, one thread: hierarchical vs flat, same KV model.

Both models are the same ``CausalLMStep`` of a seeded random Llama (onnxruntime-genai's names,
past/present KV, dynamic batch/sequence/past) exported on the TorchScript path:

* **hierarchical**: ``export_hyper_onnx`` with ``hiera=[KVStep]`` (each decoder layer one
  function, per_type), as ``task: text-generation`` builds it;
* **flat**: a plain ``torch.onnx.export(dynamo=False)`` of the same step model (no functions).

Each folder gets the same ``genai_config.json`` (``intra_op_num_threads`` 1). A run is one
greedy decode: a ``--prompt``-token prompt, then ``--tokens`` new tokens; runs alternate between
the two folders and the median tokens/s of each is reported, with their ratio. The decodes must
agree token for token (asserted).

    python bench/bench_generation.py --layers 8 --hidden 256 --repeat 7
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    from hyperexport.generation.task import step_inputs
    from hyperexport.models.inputs import make_inputs

    specs = step_inputs(config, dtype)
    return make_inputs(specs), specs


def export_both(model: Any, folder: Path) -> tuple[Path, Path]:
    """Export the hierarchical and the flat step model into ``folder/hier`` and ``folder/flat``."""
    from hyperexport import ExportOptions, export_hyper_onnx
    from hyperexport.generation.genai_config import build_genai_config
    from hyperexport.generation.model import CausalLMStep
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
    hier, flat = folder / "hier", folder / "flat"
    for target in (hier, flat):
        target.mkdir(parents=True)
        (target / "genai_config.json").write_text(json.dumps(genai))
    with explicit_kv_layers(model):
        export_hyper_onnx(
            step,
            (kwargs,),
            str(hier / "model.onnx"),
            hiera=[KVStep],
            dynamo=False,
            dynamic_axes=axes,
            options=ExportOptions(functions="per_type", probe_shapes=probe),
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
    return hier, flat


def decode(folder: Path, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Tokens per second of one greedy decode in onnxruntime-genai, and the tokens."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = len(prompt) + tokens  # min_length too: every run decodes exactly ``tokens``
    params.set_search_options(max_length=length, min_length=length, do_sample=False)
    generator = og.Generator(model, params)
    started = time.perf_counter()
    generator.append_tokens(np.asarray([prompt], dtype=np.int64))
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - started
    sequence = [int(t) for t in generator.get_sequence(0)][len(prompt) :]
    return len(sequence) / seconds, sequence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = _model(args.layers, args.hidden, args.vocab)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, args.vocab, args.prompt)]
    with tempfile.TemporaryDirectory() as tmp:
        hier, flat = export_both(model, Path(tmp))
        rates: dict[str, list[float]] = {"hierarchical": [], "flat": []}
        seen: dict[str, list[int]] = {}
        decode(hier, prompt, 4), decode(flat, prompt, 4)  # warm-up (session creation paths)
        for _ in range(args.repeat):
            for label, folder in (("hierarchical", hier), ("flat", flat)):
                rate, sequence = decode(folder, prompt, args.tokens)
                rates[label].append(rate)
                seen[label] = sequence
        assert seen["hierarchical"] == seen["flat"], "the two models decode differently"
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(
        f"layers {args.layers}, hidden {args.hidden}, vocab {args.vocab}, prompt {args.prompt}, "
        f"{args.tokens} tokens, 1 thread, median of {args.repeat}:"
    )
    for label, value in med.items():
        print(f"  {label}: {value:.1f} tokens/s")
    print(f"  hierarchical / flat: {med['hierarchical'] / med['flat']:.3f}")


if __name__ == "__main__":
    main()

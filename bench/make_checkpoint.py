"""Write a Hugging Face-style Llama checkpoint with seeded random bf16 weights, tensor by tensor.

    python bench/make_checkpoint.py OUT_DIR --shape llama3_8b
    python bench/make_checkpoint.py OUT_DIR --shape llama70b_slice
    python bench/make_checkpoint.py OUT_DIR --shape llama_1b8 --max-shard-gb 1
    python bench/make_checkpoint.py OUT_DIR --shape tiny --layers 3

The folder holds ``config.json``, ``generation_config.json``, the weights as
``model-0000N-of-0000M.safetensors`` shards and ``model.safetensors.index.json``, as
``save_pretrained`` writes them, so ``AutoModelForCausalLM.from_pretrained`` and
``safetensors.safe_open`` read it. The model is never built and no shard is ever held: tensor
names and shapes come from ``LlamaForCausalLM`` instantiated on the meta device, each shard's
header is computed from them up front, and each tensor is generated in chunks of at most
:data:`CHUNK_ELEMENTS` elements and written at once. Written pages are flushed and dropped from
the page cache every :data:`FLUSH_BYTES`, so that a 16 GB write does not crowd the (shared)
machine's page cache either. Peak RSS is the interpreter with torch plus one chunk (printed).

Weights follow transformers' Llama initialisation: normal(0, ``initializer_range`` = 0.02) for
every matrix and the embedding, 1 for norm scales. Each chunk has its own generator, seeded from
``--seed``, the tensor's name and the chunk's index, so a tensor's values do not depend on the
shard layout. Activations stay finite through 32 bf16 layers at this scale
(``tests/bench/test_make_checkpoint.py`` runs a tiny one through transformers).

Every file is written under a temporary name in the folder and renamed; ``config.json`` last,
so a folder with a config is complete. An existing non-empty folder is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The Llama shapes this writes: ``name -> LlamaConfig keyword arguments``.
SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3-8B: 8.03 B parameters, 16.06 GB in bf16.
    "llama3_8b": dict(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    # Four layers at Llama-3-70B's width: 5.3 B parameters, about 10.6 GB in bf16.
    "llama70b_slice": dict(
        num_hidden_layers=4,
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    # Eight layers at Llama-3.2-1B's width: 1.0 B parameters, 2.0 GB in bf16.
    "llama_1b8": dict(
        num_hidden_layers=8,
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    # Tests.
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    ),
}

#: Elements generated at once: 32 M bf16 elements, 64 MB.
CHUNK_ELEMENTS = 1 << 25
#: Bytes written between two flushes that drop the written pages from the page cache.
FLUSH_BYTES = 1 << 29
#: safetensors' name of bfloat16.
_DTYPE = "BF16"
_ITEMSIZE = 2


@dataclass(frozen=True)
class TensorPlan:
    """One tensor of the checkpoint: its state-dict name, shape and how it is filled."""

    name: str
    shape: tuple[int, ...]
    fill: str  # "normal" or "ones"

    @property
    def nbytes(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count * _ITEMSIZE


def llama_config(shape: str, **overrides: Any) -> Any:
    """The ``LlamaConfig`` of a named shape (bf16, untied embeddings), with overrides."""
    import transformers

    kwargs = {**SHAPES[shape], **{k: v for k, v in overrides.items() if v is not None}}
    return transformers.LlamaConfig(
        **kwargs,
        tie_word_embeddings=False,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        initializer_range=0.02,
        dtype="bfloat16",
        use_cache=False,
    )


def plan_tensors(config: Any) -> list[TensorPlan]:
    """Every persistent tensor of ``LlamaForCausalLM(config)``, in the model's order.

    The model is built on the meta device (no memory); the names and shapes are its state
    dict's, so they match what ``from_pretrained`` expects whatever transformers' release.
    """
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    plans = []
    for name, tensor in model.state_dict().items():
        fill = "ones" if name.endswith("norm.weight") else "normal"
        plans.append(TensorPlan(name, tuple(int(d) for d in tensor.shape), fill))
    return plans


def plan_shards(tensors: Sequence[TensorPlan], max_shard_bytes: int) -> list[list[TensorPlan]]:
    """Tensors grouped in order into shards of at most ``max_shard_bytes`` (a larger tensor
    gets a shard of its own), as ``save_pretrained`` does."""
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def shard_header(tensors: Sequence[TensorPlan]) -> bytes:
    """The safetensors header of a shard: 8-byte little-endian length, then the JSON, padded
    with spaces to a multiple of 8 (the format's alignment)."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        entries[tensor.name] = {
            "dtype": _DTYPE,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _chunk_seed(seed: int, name: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def tensor_chunks(tensor: TensorPlan, seed: int, std: float) -> Iterator[Any]:
    """The tensor's values, flat, as bf16 torch tensors of at most :data:`CHUNK_ELEMENTS`."""
    import torch

    total = tensor.nbytes // _ITEMSIZE
    for index, start in enumerate(range(0, total, CHUNK_ELEMENTS)):
        count = min(CHUNK_ELEMENTS, total - start)
        if tensor.fill == "ones":
            yield torch.ones(count, dtype=torch.bfloat16)
            continue
        generator = torch.Generator().manual_seed(_chunk_seed(seed, tensor.name, index))
        yield torch.empty(count, dtype=torch.bfloat16).normal_(0.0, std, generator=generator)


class _Writer:
    """Writes one file sequentially, dropping written pages from the page cache as it goes."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.written = 0
        self.flushed = 0

    def write(self, data: memoryview | bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            done = os.write(self.fd, view)
            view = view[done:]
            self.written += done
        if self.written - self.flushed >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        os.fdatasync(self.fd)
        os.posix_fadvise(self.fd, self.flushed, self.written - self.flushed, os.POSIX_FADV_DONTNEED)
        self.flushed = self.written

    def close(self) -> None:
        self.flush()
        os.close(self.fd)


def _atomic_text(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_shard(path: Path, tensors: Sequence[TensorPlan], seed: int, std: float) -> int:
    """Write one shard (to a temporary name, then renamed); returns its size in bytes."""
    temporary = path.with_name(f".{path.name}.tmp")
    writer = _Writer(temporary)
    try:
        writer.write(shard_header(tensors))
        for tensor in tensors:
            for chunk in tensor_chunks(tensor, seed, std):
                writer.write(memoryview(chunk.view(_uint8()).numpy()))
    finally:
        writer.close()
    os.replace(temporary, path)
    return writer.written


def _uint8() -> Any:
    import torch

    return torch.uint8


def write_checkpoint(
    out: Path, config: Any, *, seed: int = 0, max_shard_bytes: int = 5 * 10**9
) -> dict[str, Any]:
    """Write the checkpoint of ``config`` into ``out``; returns what was written."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise SystemExit(f"{out} is not empty; refusing to write a checkpoint over it")
    tensors = plan_tensors(config)
    shards = plan_shards(tensors, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    total = 0
    for name, shard in zip(names, shards):
        started = time.perf_counter()
        size = write_shard(out / name, shard, seed, config.initializer_range)
        total += sum(t.nbytes for t in shard)
        weight_map.update({t.name: name for t in shard})
        print(f"  {name}: {size / 1e9:.2f} GB in {time.perf_counter() - started:.1f}s", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _atomic_text(out / "model.safetensors.index.json", json.dumps(index, indent=2) + "\n")
    generation = GenerationConfig.from_model_config(config)
    _atomic_text(out / "generation_config.json", generation.to_json_string())
    _atomic_text(out / "config.json", config.to_json_string())
    return {"tensors": len(tensors), "shards": len(shards), "weights_bytes": total}


def peak_rss_bytes() -> int:
    """This process's peak resident set (``ru_maxrss``, kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--layers", type=int, help="override num_hidden_layers")
    parser.add_argument("--hidden", type=int, help="override hidden_size")
    parser.add_argument("--intermediate", type=int, help="override intermediate_size")
    parser.add_argument("--vocab", type=int, help="override vocab_size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-gb", type=float, default=5.0)
    args = parser.parse_args(argv)
    config = llama_config(
        args.shape,
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        vocab_size=args.vocab,
    )
    started = time.perf_counter()
    cpu = time.process_time()
    written = write_checkpoint(
        args.out, config, seed=args.seed, max_shard_bytes=int(args.max_shard_gb * 1e9)
    )
    figures = {
        **written,
        "shape": args.shape,
        "weights_gb": round(written["weights_bytes"] / 1e9, 3),
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "peak_rss_gb": round(peak_rss_bytes() / 1e9, 3),
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""hyperexport.library.export_budget: a streamed build's resident estimate from the checkpoint's
headers alone, and the disk an export needs before its first weight is written."""

from __future__ import annotations

import errno
import math
from pathlib import Path

import pytest

from hyperexport.base.contracts.weight_index import StoredTensor, WeightIndex
from hyperexport.library.export_budget import (
    BASELINE_BYTES,
    DISK_COPIES,
    STREAM_LAYER_COPIES,
    check_disk_budget,
    state_bytes,
    streaming_need,
)

GB = 10**9


def _index(shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> WeightIndex:
    """An index of bf16 tensors laid end to end in one file (no bytes behind it)."""
    tensors, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = math.prod(shape) * 2
        tensors[name] = StoredTensor("model.safetensors", dtype, shape, offset, nbytes)
        offset += nbytes
    return WeightIndex(tensors)


def _llama3_8b() -> WeightIndex:
    """Llama-3-8B's shapes: 32 layers, hidden 4096, intermediate 14336, GQA 32:8."""
    h, i, kv, vocab = 4096, 14336, 1024, 128256
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for n in range(32):
        layer = f"model.layers.{n}"
        for proj, shape in {
            "self_attn.q_proj": (h, h),
            "self_attn.k_proj": (kv, h),
            "self_attn.v_proj": (kv, h),
            "self_attn.o_proj": (h, h),
            "mlp.gate_proj": (i, h),
            "mlp.up_proj": (i, h),
            "mlp.down_proj": (h, i),
        }.items():
            shapes[f"{layer}.{proj}.weight"] = shape
        shapes[f"{layer}.input_layernorm.weight"] = (h,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (vocab, h)
    return _index(shapes)


def test_an_8b_checkpoint_streams_in_a_fraction_of_its_size_and_covers_what_was_measured() -> None:
    index = _llama3_8b()
    need = streaming_need(index, "bfloat16")
    assert need.block == "model.layers.0"
    assert abs(need.block_float32 - 0.872 * GB) < 0.001 * GB  # 218M parameters in float32
    assert need.total == BASELINE_BYTES + int(need.block_float32 * STREAM_LAYER_COPIES)
    # under half the 16 GB of weights, and above the 2.14 GB peak the 8B build reached
    assert 2.14 * GB < need.total < 0.5 * index.nbytes()


def test_loading_in_another_dtype_counts_the_converted_copies_of_what_stays_bound() -> None:
    index = _llama3_8b()
    as_stored, upcast = streaming_need(index), streaming_need(index, "float32")
    assert as_stored.total == streaming_need(index, "bfloat16").total
    # the embedding and the head (2 x 2.1 GB in float32) stay bound through the trace
    assert upcast.total > as_stored.total + 4 * GB


def test_blocks_are_numbered_names_and_a_model_without_any_is_one_block() -> None:
    shapes = {"encoder.block.0.w": (8, 8), "encoder.block.1.w": (8, 16), "shared.w": (4, 4)}
    need = streaming_need(_index(shapes))
    assert (need.block, need.block_float32) == ("encoder.block.1", 8 * 16 * 4)
    flat = streaming_need(_index({"w": (8, 8), "b": (8,)}))
    assert (flat.block, flat.block_float32) == ("the model", (64 + 8) * 4)


def test_the_refusal_is_one_line_with_the_estimate_the_layer_and_what_is_available() -> None:
    line = streaming_need(_llama3_8b(), "bfloat16").refusal(2 * 2**30)
    assert "\n" not in line
    assert line.startswith("a streamed build needs about 2.5 GiB (largest layer model.layers.0: ")
    assert line.endswith("832.0 MiB in float32 for the check), 2.0 GiB is available")


def test_an_export_whose_weights_cannot_fit_on_disk_is_refused_naming_the_directory(
    tmp_path: Path,
) -> None:
    with pytest.raises(OSError) as refused:
        check_disk_budget(3 << 20, tmp_path, copies=DISK_COPIES, free=5 << 20)
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(tmp_path)
    assert refused.value.strerror == (
        "the export writes about 6.0 MiB (2 x the 3.0 MiB of weights), 5.0 MiB is free"
    )
    check_disk_budget(3 << 20, tmp_path, copies=1, free=5 << 20)  # written once: it fits
    check_disk_budget(1 << 20, tmp_path)  # this machine's disk, as it is


def test_a_streamed_skeleton_counts_the_bytes_its_loaded_model_has() -> None:
    import torch

    from hyperexport import zoo
    from hyperexport.library.capture.streaming import parameters_on_meta

    loaded = zoo.tiny_llama(num_layers=2, causal_lm=True)
    with parameters_on_meta():
        skeleton = zoo.tiny_llama(num_layers=2, causal_lm=True)
    assert all(p.is_meta for p in skeleton.parameters())
    assert state_bytes(skeleton) == state_bytes(loaded) > 0
    tied = torch.nn.Linear(4, 4)
    shared = torch.nn.Sequential(tied, tied)  # one parameter twice: counted once
    assert state_bytes(shared) == (16 + 4) * 4

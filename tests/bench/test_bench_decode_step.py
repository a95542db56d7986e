"""bench/bench_decode_step.py: a folder whose config shares the KV buffer runs as
onnxruntime-genai runs it, each present bound to its past's buffer and written in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.builds import build_composed
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_GQA_QUERY_SEQLENS,
    NEEDS_HYPEREXPORT_ATTENTION,
)
from tests.helpers.scripts import load_script


@NEEDS_DECODING_TASKS
@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_GQA_QUERY_SEQLENS
def test_a_shared_buffer_is_written_in_place_at_the_new_row(tmp_path: Path) -> None:
    outcome = build_composed(
        [
            "recipe=zoo_llama_generate",
            "dynamo=false",
            "attention.implementation=hyperexport",
            "rewrite.fuse=onnxruntime",
        ],
        tmp_path,
    )
    assert outcome.exit_code == 0, outcome.lines
    bench = load_script("bench/bench_decode_step.py")
    config = bench.decoder_config(outcome.out_dir)
    assert config["search"]["past_present_share_buffer"] is True
    step = bench.Step(outcome.out_dir, past=5, max_length=9)
    before = [v.numpy().copy() for v in step.buffers]
    assert all(b.shape[2] == 9 for b in before)  # max_length rows, not the past's 5
    assert step.run(1) > 0
    after = [v.numpy() for v in step.buffers]
    for old, new in zip(before, after, strict=True):
        # the kernel wrote the new token's key/value at row 5 of the bound buffer, and
        # nothing else (no present of its own, no copy of the past)
        assert not np.array_equal(old[:, :, 5], new[:, :, 5])
        np.testing.assert_array_equal(np.delete(old, 5, axis=2), np.delete(new, 5, axis=2))

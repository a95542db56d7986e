"""bench/bench_step_bound.py: its variants of a fused generation step are the same model where
the builder's shortcuts hold (an unpadded prompt), and the bias-free one differs where they do
not (a left-padded row)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from hyperexport.library.tasks.decode import ort_padded_decode
from hyperexport.library.tasks.prompts import left_padded
from tests.helpers.builds import build_composed
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_GQA_QUERY_SEQLENS,
    NEEDS_HYPEREXPORT_ATTENTION,
)
from tests.helpers.scripts import load_script

PROMPTS = [[17, 93, 41, 8, 120, 66, 5], [71, 30, 99, 12]]
BIAS_FREE = {"no_bias", "both", "builder_layout"}


def _decode(folder: Path, prompts: list[list[int]]) -> tuple[list[list[int]], np.ndarray]:
    ids, mask = left_padded(prompts, 0)
    return ort_padded_decode(folder / "model.onnx", ids, mask, 6, [], 0)


def _ops(folder: Path) -> Counter[str]:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    return Counter(node.op_type for node in model.graph.node)


@NEEDS_DECODING_TASKS
@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_GQA_QUERY_SEQLENS
def test_the_variants_keep_an_unpadded_decode_and_only_the_bias_free_lose_a_padded_row(
    tmp_path: Path,
) -> None:
    outcome = build_composed(
        [
            "recipe=zoo_llama_generate",
            "dynamo=false",
            "attention.implementation=hyperexport",
            "rewrite.fuse=onnxruntime",
            "quantize.method=int4_block",
        ],
        tmp_path,
    )
    assert outcome.exit_code == 0, outcome.lines
    # the int4 model alone, as model.onnx (its data file, if any, keeps the name it refers to)
    ours = tmp_path / "ours"
    ours.mkdir()
    for path in outcome.out_dir.glob("model.quantized.onnx*"):
        (ours / path.name).write_bytes(path.read_bytes())
    (ours / "model.onnx").write_bytes((ours / "model.quantized.onnx").read_bytes())
    bench = load_script("bench/bench_step_bound.py")
    made = bench.variants(ours, tmp_path / "variants")
    ops = {name: _ops(folder) for name, folder in made.items()}
    assert "Where" in ops["inlined"] and "Where" not in ops["no_bias"]  # the bias is gone
    assert "Add" in ops["inlined"] and "Add" not in ops["boundary"]  # the residual adds too
    assert ops["boundary"]["SimplifiedLayerNormalization"] == 1  # but the first layer's norm
    assert "Split" in ops["both"] and "Split" not in ops["builder_layout"]
    single, single_logits = _decode(ours, PROMPTS[:1])
    padded, _ = _decode(ours, PROMPTS)
    for name, folder in made.items():
        tokens, logits = _decode(folder, PROMPTS[:1])
        assert tokens == single, name
        np.testing.assert_allclose(logits, single_logits, atol=2e-3, err_msg=name)
        rows, _ = _decode(folder, PROMPTS)
        # row 1 is left-padded: the variants without the bias attend its pads
        assert (rows[1] == padded[1]) is (name not in BIAS_FREE), name

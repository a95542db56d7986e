"""``passes/rotary_tables.py``: a fused generation step's attention reads constant rotary tables
by ``position_ids``, and ONNX Runtime computes what the per-token rows computed; a rotary
subgraph that is not a table of positions keeps its rows.

The step is a seeded tiny Llama's (``CausalLMStep``), exported with ``rewrite.fuse:
onnxruntime`` twice, without and with ``ExportOptions.context_length``; the probe cases are
main graphs in ONNX text, as transformers' rotary embedding exports (positions times inverse
frequencies, concatenated, ``Cos`` and ``Sin``)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from hyperexport.base.contracts.names import is_invariant_input
from hyperexport.library.passes.graph_probe import Unprobeable
from hyperexport.library.passes.rotary_tables import _evaluate
from tests.helpers.fused_steps import (
    CONTEXT,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    VOCAB,
    export_fused_step,
)
from tests.helpers.release_skips import (
    NEEDS_DECODING_TASKS,
    NEEDS_GQA_QUERY_SEQLENS,
    NEEDS_HYPEREXPORT_ATTENTION,
    NEEDS_OPSET_18,
)


def _feeds(mask: np.ndarray, new: int, pasts: list[np.ndarray], seed: int) -> dict[str, np.ndarray]:
    positions = np.cumsum(mask, -1) - 1
    positions[mask == 0] = 1
    feeds = {
        "input_ids": np.random.default_rng(seed).integers(3, VOCAB, (mask.shape[0], new)),
        "attention_mask": mask,
        "position_ids": positions[:, -new:],
    }
    for i in range(LAYERS):
        feeds[f"past_key_values.{i}.key"] = pasts[2 * i]
        feeds[f"past_key_values.{i}.value"] = pasts[2 * i + 1]
    return feeds


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("rotary_tables")
    return export_fused_step(folder, 0), export_fused_step(folder, CONTEXT)


@NEEDS_GQA_QUERY_SEQLENS
@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_DECODING_TASKS
@NEEDS_OPSET_18
def test_the_step_takes_position_ids_and_tables_for_cos_and_sin(steps: tuple[Path, Path]) -> None:
    rows, tables = (onnx.load(str(p), load_external_data=False) for p in steps)
    [before], [after] = rows.functions, tables.functions
    assert {"cos", "sin"} <= set(before.input) and "position_ids" not in before.input
    assert not {"cos", "sin"} & set(after.input)
    assert list(after.input)[:5] == [
        "hidden_states", "attention_mask", "past_key", "past_value", "position_ids"
    ]  # fmt: skip
    # the tables last among the weights; what the main graph computes for every layer after
    # them (hoist_invariants.py)
    weights = [name for name in after.input if not is_invariant_input(name)]
    assert weights[-2:] == ["rotary_cos_cache", "rotary_sin_cache"]
    made = {i.name: list(i.dims) for i in tables.graph.initializer if i.name.startswith("rotary")}
    half = HIDDEN // HEADS // 2
    assert made == {
        "rotary_tables.0.cos_cache": [CONTEXT, half],
        "rotary_tables.0.sin_cache": [CONTEXT, half],
    }
    main_ops = {n.op_type for n in tables.graph.node}
    assert {"Cos", "Sin"} <= {n.op_type for n in rows.graph.node} and not {"Cos", "Sin"} & main_ops
    pads = [n for f in tables.functions for n in f.node if n.op_type in ("Pad", "Range")]
    assert not pads  # no rows to pad or number


@NEEDS_GQA_QUERY_SEQLENS
@NEEDS_HYPEREXPORT_ATTENTION
@NEEDS_DECODING_TASKS
@NEEDS_OPSET_18
def test_a_left_padded_prompt_and_the_decode_after_it_compute_the_same(
    steps: tuple[Path, Path],
) -> None:
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in steps]
    head = HIDDEN // HEADS
    empty = [np.zeros((2, KV_HEADS, 0, head), np.float32)] * (2 * LAYERS)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    prompt = _feeds(mask, 5, empty, seed=1)
    expected, got = (s.run(None, prompt) for s in sessions)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
    decode = _feeds(mask, 1, expected[1:], seed=2)
    for e, g in zip(*(s.run(None, decode) for s in sessions), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)
    # the last position the tables hold rotates as its row says: a decode at the context's end
    last = np.ones((2, CONTEXT), np.int64)
    pasts = [np.zeros((2, KV_HEADS, CONTEXT - 1, head), np.float32)] * (2 * LAYERS)
    at_end = _feeds(last, 1, pasts, seed=3)
    for e, g in zip(*(s.run(None, at_end) for s in sessions), strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)


#: A main graph computing cos and sin from the positions ({scale}: what they are scaled by).
ROTARY = """
<ir_version: 10, opset_import: ["" : 18]>
main (int64[batch, seq] position_ids, int64[batch, total] attention_mask)
    => (float[batch, seq, 8] cos, float[batch, seq, 8] sin) {{
    axis = Constant <value_ints = [2]> ()
    at = Unsqueeze (position_ids, axis)
    angle = Cast <to = 1> (at)
    inverse = Constant <value = float[1, 1, 4] {{1.0, 0.1, 0.01, 0.001}}> ()
    freqs = Mul (angle, inverse)
    {scale}
    both = Concat <axis = -1> (scaled, scaled)
    cos = Cos (both)
    sin = Sin (both)
}}
"""
BY_POSITION = "scaled = Identity (freqs)"
#: Scaled by the sequence's length, as a dynamic scaling would: not a table of positions.
BY_LENGTH = """length = Shape <start = 1, end = 2> (position_ids)
    long = Cast <to = 1> (length)
    scaled = Mul (freqs, long)"""
#: Scaled by the mask: the tables would need another input.
BY_MASK = """masked = ReduceSum <keepdims = 0> (attention_mask)
    count = Cast <to = 1> (masked)
    scaled = Mul (freqs, count)"""


def _tables(scale: str) -> list[np.ndarray]:
    model = ir.serde.deserialize_model(onnx.parser.parse_model(ROTARY.format(scale=scale)))
    cos, sin = model.graph.outputs
    return _evaluate(model, cos, sin, 64)


def test_a_table_of_positions_is_the_first_halves_for_every_position() -> None:
    cos, sin = _tables(BY_POSITION)
    angles = np.arange(64)[:, None] * np.array([1.0, 0.1, 0.01, 0.001])
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-6)


@pytest.mark.parametrize(
    ("scale", "reason"),
    [(BY_LENGTH, "not the rows of positions"), (BY_MASK, "not from position_ids alone")],
    ids=["scaled by the length", "read off the mask"],
)
def test_what_is_no_table_of_positions_is_refused(scale: str, reason: str) -> None:
    with pytest.raises(Unprobeable, match=reason):
        _tables(scale)


def test_a_refusal_keeps_the_rows_saying_why(caplog: pytest.LogCaptureFixture) -> None:
    """Through the pass: the probe's refusal is logged at INFO and nothing is made."""
    from hyperexport.library.passes.rotary_tables import RotaryTablesPass

    model = ir.serde.deserialize_model(onnx.parser.parse_model(ROTARY.format(scale=BY_LENGTH)))
    cos, sin = model.graph.outputs
    with caplog.at_level(logging.INFO, logger="hyperexport"):
        made = RotaryTablesPass(64, record=None)._tables(model, cos, sin, 0)  # type: ignore[arg-type]
    assert made is None and not model.graph.initializers
    assert "stay per-token rows" in caplog.text and "not the rows of positions" in caplog.text

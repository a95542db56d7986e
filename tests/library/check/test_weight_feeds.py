"""One ONNX Runtime session per function structure, each call fed its own weights (issue 36)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from check_toys import make_toy
from test_bfloat16 import _export_low_precision

from hyperexport.library.check import CheckSettings
from hyperexport.library.check.model_evaluator import ModelEvaluator, evaluate_model
from hyperexport.library.check.weight_feeds import WeightFeeds
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH


def test_every_bfloat16_converts_exactly_into_the_reused_buffer() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    tensor = ir.tensor(bits.view(ml_dtypes.bfloat16))
    feeds = WeightFeeds(upcast=True)
    first = feeds.feeds([tensor])["weight_0"]
    expected = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    assert first.dtype == np.float32
    assert np.array_equal(first.view(np.uint32) >> 16, bits)  # NaN payloads too
    finite = np.isfinite(expected)
    assert np.array_equal(first[finite], expected[finite])
    again = feeds.feeds([tensor])["weight_0"]
    assert again is first  # the same buffer, not a new allocation per call


def test_float16_converts_and_float32_is_fed_as_it_is() -> None:
    half = np.linspace(-3, 3, 11, dtype=np.float16)
    single = np.linspace(-1, 1, 5, dtype=np.float32)
    feeds = WeightFeeds(upcast=True).feeds([ir.tensor(half), ir.tensor(single)])
    assert np.array_equal(feeds["weight_0"], half.astype(np.float32))
    assert feeds["weight_1"].dtype == np.float32 and np.array_equal(feeds["weight_1"], single)
    kept = WeightFeeds(upcast=False).feeds([ir.tensor(half)])["weight_0"]
    assert kept.dtype == np.float16


@NEEDS_DYNAMO_PATH  # a bfloat16 Llama: exported on the dynamo path (tests/library/check/test_bfloat16.py)
def test_one_session_serves_every_layer_and_each_call_gets_its_own_weights(
    tmp_path: Path,
) -> None:
    path, manifest, capture = _export_low_precision(tmp_path, "bfloat16", "per_type")
    everything = CheckSettings(function_scope="all")
    evaluation = evaluate_model(path, manifest, capture.record, capture.arrays, everything)
    layers = [r for r in evaluation.functions if "layers." in r.call_id]
    assert len(layers) == 2 and all(r.error is None for r in layers)
    assert evaluation.sessions_built == 1
    # Each layer run alone, in a session of its own, computes the same bits as in the shared
    # session (with the other layer's weights converted into the other buffer slot meanwhile).
    for run in layers:
        alone = ModelEvaluator(path, manifest, capture.record, capture.arrays)
        (again,) = alone.run_functions([run.index], "scope")
        for out, out_alone in zip(run.outputs, again.outputs, strict=True):
            assert np.array_equal(
                evaluation.arrays[out.array].view(np.uint16),
                alone.computed[out_alone.array].view(np.uint16),
            ), run.call_id
    assert layers[0].outputs and not np.array_equal(
        evaluation.arrays[layers[0].outputs[0].array].view(np.uint16),
        evaluation.arrays[layers[1].outputs[0].array].view(np.uint16),
    )


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("mode", ["per_type", "per_instance"])
def test_a_float32_model_checks_every_call(tmp_path: Path, mode: str, dynamo: bool) -> None:
    path, manifest, capture = _export_low_precision(tmp_path, "float32", mode, dynamo)
    evaluation = evaluate_model(
        path, manifest, capture.record, capture.arrays, CheckSettings(function_scope="all")
    )
    assert evaluation.functions and all(r.error is None for r in evaluation.functions)
    assert evaluation.sessions_built == (1 if mode == "per_type" else len(evaluation.functions))


def test_calls_sharing_weights_from_the_data_file_run_alike(tmp_path: Path) -> None:
    # head#0 and head#1 pass the same W1/B1: the first call's release must not unmap what the
    # second call's feeds (prepared meanwhile) read.
    toy = make_toy("per_type")
    inline, external = tmp_path / "inline.onnx", tmp_path / "external.onnx"
    ir.save(toy.model, inline)
    ir.save(toy.model, external, external_data="external.onnx.data", size_threshold_bytes=0)
    scope = CheckSettings(function_scope="all")
    runs = [
        evaluate_model(p, toy.manifest, toy.capture, toy.arrays, scope) for p in (inline, external)
    ]
    assert runs[1].sessions_built < 4  # head#0 and head#1 share one
    assert [r.error for r in runs[1].functions] == [None] * 4
    for a, b in zip(runs[0].functions, runs[1].functions, strict=True):
        for out_a, out_b in zip(a.outputs, b.outputs, strict=True):
            assert np.array_equal(runs[0].arrays[out_a.array], runs[1].arrays[out_b.array])


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_float32_weights_read_from_the_data_file_are_unmapped_after_each_call(
    tmp_path: Path, dynamo: bool
) -> None:
    # float32 weights are fed as views over the data file's maps; a call whose weights were
    # prepared while the previous one ran (the third call on: the session exists by then) must
    # drop those views before its maps close. A BufferError from the release failed every fp32
    # build of three or more layers with external weights.
    path, manifest, capture = _export_low_precision(tmp_path, "float32", "per_type", dynamo, 3)
    external = tmp_path / "external.onnx"
    ir.save(ir.load(path), external, external_data="external.onnx.data", size_threshold_bytes=0)
    evaluation = evaluate_model(
        external, manifest, capture.record, capture.arrays, CheckSettings(function_scope="all")
    )
    assert [r.error for r in evaluation.functions] == [None] * len(manifest.calls)
    assert len(manifest.calls) == 3 and evaluation.sessions_built == 1

"""The quantized comparison's measures, its judge, and the ORT support probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hyperexport.library.check.quantized import closeness
from hyperexport.library.check.quantized_judge import QuantizedThresholds, judge_quantized
from hyperexport.library.check.quantized_record import Closeness, QuantizedComparison
from hyperexport.library.check.quantized_support import unsupported_reason

DEFAULTS = QuantizedThresholds(min_cosine=0.95, max_rel_error=0.35, min_top1=0.75)


def test_closeness_measures() -> None:
    f = np.random.default_rng(0).standard_normal((2, 5, 10)).astype(np.float32)
    same = closeness("last_hidden_state", [f.copy()], [f])
    assert same.rel_error == 0.0 and abs(same.cosine - 1.0) < 1e-9 and same.top1 is None
    flipped = closeness("logits", [-f], [f])
    assert abs(flipped.rel_error - 2.0) < 1e-6 and abs(flipped.cosine + 1.0) < 1e-6
    assert flipped.top1 is not None and flipped.top1 < 0.5
    one_class = f.copy()
    one_class[0, 0] = one_class[0, 0][::-1]  # one position of ten has another argmax (or not)
    top1 = closeness("logits", [one_class], [f]).top1
    expected = float(np.mean(one_class.argmax(-1) == f.argmax(-1)))
    assert top1 == expected and 0.8 <= expected <= 1.0


def _comparison(*functions: Closeness) -> QuantizedComparison:
    output = Closeness("logits", rel_error=0.1, cosine=0.99, top1=0.9)
    return QuantizedComparison(
        "int4_block", 32, {"Layer": {"MatMulNBits": 3}}, (output,), functions
    )


def test_judge_passes_and_names_the_worst_layer() -> None:
    verdict = judge_quantized(
        _comparison(
            Closeness("a#0", "layers.0", "Layer", rel_error=0.10, cosine=0.995),
            Closeness("b#0", "layers.1", "Layer", rel_error=0.20, cosine=0.98),
        ),
        DEFAULTS,
    )
    assert verdict.passed and verdict.worst is not None and verdict.worst.module_path == "layers.1"
    assert "largest error: layers.1 (Layer)" in "\n".join(verdict.summary_lines())
    assert "quantized ops in Layer: MatMulNBits x3" in "\n".join(verdict.summary_lines())


def test_judge_fails_on_each_threshold() -> None:
    broken = Closeness("b#0", "layers.1", "Layer", rel_error=0.9, cosine=0.4)
    verdict = judge_quantized(_comparison(broken), DEFAULTS)
    assert not verdict.passed and "cosine 0.4000 < 0.95" in verdict.failed[0]
    assert "rel_error 0.9000 > 0.35" in verdict.failed[0]
    low_top1 = QuantizedComparison(
        "int4_block", 32, {}, (Closeness("logits", rel_error=0.1, cosine=0.99, top1=0.5),), ()
    )
    assert "top1 0.500 < 0.75" in judge_quantized(low_top1, DEFAULTS).failed[0]
    errored = judge_quantized(_comparison(Closeness("c#0", "x", "F", error="boom")), DEFAULTS)
    assert not errored.passed


def test_record_round_trips(tmp_path: Path) -> None:
    directory = tmp_path
    comparison = _comparison(Closeness("a#0", "layers.0", "Layer", rel_error=0.1, cosine=0.99))
    comparison.save(directory)
    assert QuantizedComparison.load(directory) == comparison
    assert QuantizedComparison.load(directory / "missing") is None


def test_ort_support_is_asked_not_assumed() -> None:
    assert unsupported_reason("int4_block", "float32") is None
    assert unsupported_reason("int4_block", "float32", 4) is None  # int8 activations
    assert unsupported_reason("int4_block", "float16", 4) is None
    assert unsupported_reason("int8_dynamic", "float32") is None
    reason = unsupported_reason("int8_dynamic", "float16")  # DynamicQuantizeMatMul: float only
    assert reason is not None and "DynamicQuantizeMatMul" in reason

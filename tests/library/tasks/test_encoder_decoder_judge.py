"""The seq2seq decode's judge (numpy only): equal tokens are not enough; the reference must be
long enough and varied, and each step decided by more than the measured logits error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hyperexport.library.tasks.arrays import write_npz
from hyperexport.library.tasks.judge import MIN_STEPS, judge_seq2seq, merge_reports
from hyperexport.library.tasks.registry import SEQ2SEQ_DECODED_JSON as DECODED_JSON
from hyperexport.library.tasks.registry import SEQ2SEQ_DECODED_NPZ as DECODED_NPZ
from hyperexport.library.tasks.registry import SEQ2SEQ_REFERENCE_JSON as REFERENCE_JSON
from hyperexport.library.tasks.registry import SEQ2SEQ_REFERENCE_NPZ as REFERENCE_NPZ


def _logits(tokens: list[int], gap: float, vocab: int = 16) -> np.ndarray:
    logits = np.zeros((len(tokens), vocab), dtype=np.float32)
    for step, token in enumerate(tokens):
        logits[step, token] = gap
    return logits


def _write(tmp_path: Path, want: list[int], got: list[int], gap: float, noise: float) -> Path:
    trace, evaluate = tmp_path / "trace", tmp_path / "evaluate"
    trace.mkdir(parents=True)
    evaluate.mkdir(parents=True)
    reference = {"tokens": [want], "max_new_tokens": len(want), "inputs": [["input_ids"]]}
    (trace / REFERENCE_JSON).write_text(json.dumps(reference))
    write_npz(trace / REFERENCE_NPZ, {"logits.0": _logits(want, gap)})
    (evaluate / DECODED_JSON).write_text(json.dumps({"runtime": "onnxruntime", "tokens": [got]}))
    write_npz(evaluate / DECODED_NPZ, {"logits.0": _logits(want, gap) + noise})
    return tmp_path


def _judge(root: Path) -> list[str]:
    results, _ = judge_seq2seq(root / "trace", root / "evaluate", root)
    return [p for r in results for p in r.problems]


def test_a_long_varied_decode_with_a_wide_gap_passes(tmp_path: Path) -> None:
    tokens = [3, 7, 9, 3, 11, 5, 7, 9, 12, 4]
    root = _write(tmp_path, tokens, tokens, gap=1.0, noise=1e-4)
    assert _judge(root) == []
    assert json.loads((root / "seq2seq_check.json").read_text())["passed"]


def test_short_constant_divergent_or_undecided_decodes_fail(tmp_path: Path) -> None:
    short = [3, 7, 9]
    assert any(
        "ends after 3 steps" in p for p in _judge(_write(tmp_path / "a", short, short, 1, 0))
    )
    constant = [5] * MIN_STEPS
    problems = _judge(_write(tmp_path / "b", constant, constant, 1.0, 0.0))
    assert any("repeats itself" in p for p in problems)
    varied = [3, 7, 9, 3, 11, 5, 7, 9]
    other = [*varied[:4], 1, *varied[5:]]
    assert any(
        "diverge at step 4" in p for p in _judge(_write(tmp_path / "c", varied, other, 1, 0))
    )
    problems = _judge(_write(tmp_path / "d", varied, varied, gap=1e-3, noise=1e-2))
    assert any("does not exceed the measured logits error" in p for p in problems)


def test_merged_reports_prefix_each_graph() -> None:
    def report(ok: bool) -> dict[str, object]:
        return {
            "ok": ok,
            "structural": [{"name": "checker", "ok": True}],
            "end_to_end": {"ok": ok, "error": None, "skipped": None, "outputs": [{"name": "y"}]},
            "functions": [{"module_path": "layers.0", "ok": ok}],
            "first_divergent_module": None if ok else "layers.0",
        }

    merged = merge_reports({"encoder": report(True), "decoder": report(False)})
    assert merged["ok"] is False and set(merged["graphs"]) == {"encoder", "decoder"}
    assert [o["name"] for o in merged["end_to_end"]["outputs"]] == ["encoder/y", "decoder/y"]
    assert [f["module_path"] for f in merged["functions"]] == [
        "encoder/layers.0",
        "decoder/layers.0",
    ]
    assert merged["first_divergent_module"] == "decoder/layers.0"

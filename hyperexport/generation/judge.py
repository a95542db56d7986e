"""The check stage's part for ``task: text-generation``: tokens and logits judged with numpy.

A decode passes when:

* the exported model's token ids equal transformers' for every prompt (and the padded batch);
* the tokens vary: each sequence has at least :data:`MIN_DISTINCT` distinct ids (a random-weight
  model that repeats one token proves little);
* the decision is robust: at every step, the reference's gap between its two best logits exceeds
  the largest logit difference measured between the export and transformers over the decode.

The report names the first diverging step of each sequence and the logits' maximum difference
per step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.atomic import atomic_write_bytes
from hyperexport.errors import CheckError
from hyperexport.generation.arrays import read_npz
from hyperexport.generation.names import (
    GENERATED_JSON,
    GENERATED_NPZ,
    GENERATION_CHECK,
    REFERENCE_JSON,
    REFERENCE_NPZ,
)

#: Fewest distinct generated ids a sequence must have for the comparison to count.
MIN_DISTINCT = 3


class GenerationCheckError(CheckError):
    """The exported model's decode differs from transformers', or proves too little."""


@dataclass
class SequenceResult:
    """One decoded sequence (a prompt alone, or one row of the padded batch) compared."""

    name: str
    reference: list[int]
    exported: list[int]
    first_divergence: int | None
    max_diff_per_step: list[float]
    min_top2_gap: float
    distinct: int
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dict(vars(self))


def _top2_gaps(logits: np.ndarray) -> np.ndarray:
    top = np.sort(logits, axis=-1)
    return np.asarray(top[..., -1] - top[..., -2])


def compare(
    name: str,
    reference: Sequence[int],
    exported: Sequence[int],
    ref_logits: np.ndarray,
    got_logits: np.ndarray,
) -> SequenceResult:
    """Compare one sequence: ``*_logits`` are ``(steps, vocab)`` at the generated position."""
    reference, exported = list(reference), list(exported)
    first = next(
        (i for i, (a, b) in enumerate(zip(reference, exported)) if a != b),
        None if len(reference) == len(exported) else min(len(reference), len(exported)),
    )
    steps = min(len(ref_logits), len(got_logits))
    diffs = [float(np.max(np.abs(ref_logits[i] - got_logits[i]))) for i in range(steps)]
    gaps = _top2_gaps(ref_logits[:steps]) if steps else np.zeros(0)
    result = SequenceResult(
        name=name,
        reference=reference,
        exported=exported,
        first_divergence=first,
        max_diff_per_step=diffs,
        min_top2_gap=float(gaps.min()) if steps else 0.0,
        distinct=len(set(reference)),
    )
    if first is not None:
        result.problems.append(
            f"tokens diverge at step {first}: transformers {reference[first : first + 1]}, "
            f"export {exported[first : first + 1]}"
        )
    if result.distinct < MIN_DISTINCT:
        result.problems.append(
            f"the reference repeats itself ({result.distinct} distinct ids < {MIN_DISTINCT}): "
            "choose other prompts or seeds"
        )
    worst = max(diffs, default=0.0)
    if steps and result.min_top2_gap <= worst:
        result.problems.append(
            f"top-2 logit gap {result.min_top2_gap:.3g} does not exceed the measured logits "
            f"error {worst:.3g}: a tie could decide the token"
        )
    return result


def judge_generation(
    trace_dir: Path, evaluate_dir: Path, out_dir: Path
) -> tuple[list[SequenceResult], GenerationCheckError | None]:
    """Judge the decode and write ``generation_check.json``.

    Returns:
        The results per sequence, and the error to raise when any failed (None when all
        passed); the caller raises it once its own report is written.
    """
    reference = json.loads((trace_dir / REFERENCE_JSON).read_text(encoding="utf-8"))
    exported = json.loads((evaluate_dir / GENERATED_JSON).read_text(encoding="utf-8"))
    ref_arrays = read_npz(trace_dir / REFERENCE_NPZ)
    got_arrays = read_npz(evaluate_dir / GENERATED_NPZ)
    results = [
        compare(
            f"prompt {i}",
            want,
            exported["single"][i],
            ref_arrays[f"single.{i}"],
            got_arrays[f"single.{i}"],
        )
        for i, want in enumerate(reference["single"])
    ]
    for row, want in enumerate(reference["batch"]):
        results.append(
            compare(
                f"padded batch row {row}",
                want,
                exported["batch"][row],
                ref_arrays["batch"][:, row],
                got_arrays["batch"][:, row],
            )
        )
    report = {
        "passed": not any(r.problems for r in results),
        "runtime": exported["runtime"],
        "batch_runtime": exported["batch_runtime"],
        "sequences": [r.to_json() for r in results],
    }
    text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / GENERATION_CHECK, text.encode("utf-8"))
    failed = [f"{r.name}: {p}" for r in results for p in r.problems]
    error = (
        GenerationCheckError(f"generation check failed: {'; '.join(failed)}") if failed else None
    )
    return results, error


def verdict(r: SequenceResult, what: str = "tokens identical") -> str:
    """What the comparison of one sequence found, as the check judged it: ``16 tokens
    identical`` when it passed; else ``FAILED: 6 of 16 tokens identical: <each problem>``."""
    if not r.problems:
        return f"{len(r.exported)} {what}"
    same = len(r.reference) if r.first_divergence is None else r.first_divergence
    return f"FAILED: {same} of {len(r.reference)} {what}: {'; '.join(r.problems)}"


def summary_lines(results: Sequence[SequenceResult]) -> list[str]:
    """One line per sequence for ``check.txt``."""
    return [
        f"generation {r.name}: {verdict(r)}, max logits diff "
        f"{max(r.max_diff_per_step, default=0.0):.2e}, min top-2 gap {r.min_top2_gap:.2e}"
        for r in results
    ]

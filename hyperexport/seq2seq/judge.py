"""The check stage's part for the encoder-decoder tasks: the decode judged with numpy.

Each prompt's decode through the exported graphs must equal transformers' greedy ``generate``
token for token, have at least :data:`MIN_STEPS` steps and
:data:`~hyperexport.generation.judge.MIN_DISTINCT` distinct ids, and at every step the
reference's top-2 logit gap must exceed the largest logit difference measured over the decode
(:func:`hyperexport.generation.judge.compare`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hyperexport.atomic import atomic_write_bytes
from hyperexport.generation.arrays import read_npz
from hyperexport.generation.judge import GenerationCheckError, SequenceResult, compare, verdict
from hyperexport.seq2seq.names import (
    DECODED_JSON,
    DECODED_NPZ,
    REFERENCE_JSON,
    REFERENCE_NPZ,
    SEQ2SEQ_CHECK,
)

#: Fewest decode steps the reference must have for the comparison to count (an early
#: end-of-sequence id proves little).
MIN_STEPS = 8


def judge_seq2seq(
    trace_dir: Path, evaluate_dir: Path, out_dir: Path
) -> tuple[list[SequenceResult], GenerationCheckError | None]:
    """Judge the decode and write ``seq2seq_check.json``.

    Returns:
        The results per prompt, and the error to raise when any failed (None when all passed);
        the caller raises it once its own report is written.
    """
    reference = json.loads((trace_dir / REFERENCE_JSON).read_text(encoding="utf-8"))
    exported = json.loads((evaluate_dir / DECODED_JSON).read_text(encoding="utf-8"))
    ref_arrays = read_npz(trace_dir / REFERENCE_NPZ)
    got_arrays = read_npz(evaluate_dir / DECODED_NPZ)
    results = []
    for i, want in enumerate(reference["tokens"]):
        result = compare(
            f"prompt {i}",
            want,
            exported["tokens"][i],
            ref_arrays[f"logits.{i}"],
            got_arrays[f"logits.{i}"],
        )
        if len(want) < MIN_STEPS:
            result.problems.append(
                f"the reference ends after {len(want)} steps (< {MIN_STEPS}): "
                "choose other prompts or seeds"
            )
        results.append(result)
    report = {
        "passed": not any(r.problems for r in results),
        "runtime": exported["runtime"],
        "sequences": [r.to_json() for r in results],
    }
    text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(out_dir / SEQ2SEQ_CHECK, text.encode("utf-8"))
    failed = [f"{r.name}: {p}" for r in results for p in r.problems]
    error = GenerationCheckError(f"seq2seq check failed: {'; '.join(failed)}") if failed else None
    return results, error


def summary_lines(results: Sequence[SequenceResult]) -> list[str]:
    """One line per prompt for ``check.txt``."""
    return [
        f"seq2seq {r.name}: "
        f"{verdict(r, 'decode steps through the graphs identical to transformers')}, "
        f"max logits diff {max(r.max_diff_per_step, default=0.0):.2e}, "
        f"min top-2 gap {r.min_top2_gap:.2e}"
        for r in results
    ]


def merge_reports(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One ``check.json`` for several graphs: each graph's report under ``graphs``, and the
    lists readers of a one-graph report use (``structural``, ``end_to_end.outputs``,
    ``functions``) concatenated, each name prefixed with its graph (``decoder/logits``)."""

    def named(graph: str, item: Mapping[str, Any], key: str) -> dict[str, Any]:
        out = dict(item)
        if out.get(key) is not None:
            out[key] = f"{graph}/{out[key]}"
        return out

    ends = [r["end_to_end"] for r in reports.values()]
    return {
        "ok": all(bool(r["ok"]) for r in reports.values()),
        "graphs": {g: dict(r) for g, r in reports.items()},
        "structural": [named(g, s, "name") for g, r in reports.items() for s in r["structural"]],
        "end_to_end": {
            "ok": all(bool(e["ok"]) for e in ends),
            "error": "; ".join(f"{g}: {e['error']}" for g, e in zip(reports, ends) if e["error"])
            or None,
            "skipped": "; ".join(
                f"{g}: {e['skipped']}" for g, e in zip(reports, ends) if e["skipped"]
            )
            or None,
            "outputs": [named(g, o, "name") for g, e in zip(reports, ends) for o in e["outputs"]],
        },
        "functions": [
            named(g, f, "module_path") for g, r in reports.items() for f in r["functions"]
        ],
        "first_divergent_module": next(
            (
                f"{g}/{r['first_divergent_module']}"
                for g, r in reports.items()
                if r.get("first_divergent_module")
            ),
            None,
        ),
    }

"""Each task's part in the check stage (:class:`~hyperexport.library.tasks.task.TaskJudge`): the decode
of the exported graphs judged against the reference decode, with numpy (no ONNX library).

A decode passes when (one comparison, :func:`compare`, for every task):

* the exported model's token ids equal transformers' for every prompt (and, for
  ``task: text-generation``, the padded batch);
* the tokens vary: each sequence has at least ``min_distinct`` distinct ids (the recipe's
  ``check.generation.min_distinct``, :data:`MIN_DISTINCT` by default): a model that repeats one
  token proves little, since an export that fixes one token (a wrong mask, a frozen position)
  repeats too;
* the decision is robust: at every step, the reference's gap between its two best logits exceeds
  the largest logit difference measured between the export and transformers over the decode;
* for the encoder-decoders, the reference has at least :data:`MIN_STEPS` steps (an early
  end-of-sequence id proves little).

The report names the first diverging step of each sequence and the logits' maximum difference
per step. ``task: text-generation`` also vouches for ``genai_config.json``
(:func:`~hyperexport.library.tasks.genai_config.genai_config_problems`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyperexport.base.atomic import atomic_write_bytes
from hyperexport.base.contracts.names import QUANTIZED_MODEL_FILE as QUANTIZED_MODEL_NAME
from hyperexport.base.contracts.names import (
    SPEECH_RECOGNITION,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
)
from hyperexport.base.errors import CheckError, override
from hyperexport.library.defaults import DEFAULT_MIN_DISTINCT
from hyperexport.library.tasks.arrays import read_npz
from hyperexport.library.tasks.registry import (
    GENAI_CONFIG,
    GENERATED_JSON,
    GENERATED_NPZ,
    GENERATED_QUANTIZED_JSON,
    GENERATED_QUANTIZED_NPZ,
    GENERATION_CHECK,
    GENERATION_REFERENCE_JSON,
    GENERATION_REFERENCE_NPZ,
    SEQ2SEQ_CHECK,
    SEQ2SEQ_DECODED_JSON,
    SEQ2SEQ_DECODED_NPZ,
    SEQ2SEQ_REFERENCE_JSON,
    SEQ2SEQ_REFERENCE_NPZ,
)
from hyperexport.library.tasks.task import (
    QuantizedDecodeGates,
    QuantizedDecodeVerdict,
    TaskJudge,
    Vouched,
)

#: Fewest distinct generated ids a sequence must have for the comparison to count, unless the
#: recipe's ``check.generation.min_distinct`` says otherwise.
MIN_DISTINCT = DEFAULT_MIN_DISTINCT
#: The recipe field that sets it: named in the refusal, so that the line says how to accept it.
MIN_DISTINCT_FIELD = "check.generation.min_distinct"

#: Fewest decode steps an encoder-decoder's reference must have for the comparison to count.
MIN_STEPS = 8


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
    min_distinct: int = MIN_DISTINCT,
) -> SequenceResult:
    """Compare one sequence: ``*_logits`` are ``(steps, vocab)`` at the generated position;
    the reference must hold ``min_distinct`` distinct ids."""
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
    if result.distinct < min_distinct:
        result.problems.append(
            f"the reference repeats itself ({result.distinct} distinct ids < {min_distinct}), "
            "which random weights often do: choose other prompts, or accept it with "
            f"{override(MIN_DISTINCT_FIELD, result.distinct)} (the tokens are still compared "
            "one by one)"
        )
    worst = max(diffs, default=0.0)
    if steps and result.min_top2_gap <= worst:
        result.problems.append(
            f"top-2 logit gap {result.min_top2_gap:.3g} does not exceed the measured logits "
            f"error {worst:.3g}: a tie could decide the token"
        )
    return result


def _verdict_file(
    results: Sequence[SequenceResult], runtimes: Mapping[str, str], path: Path, label: str
) -> GenerationCheckError | None:
    """Write the decode's judgement (``passed``, the runtimes, every sequence) to ``path``; the
    error to raise when any sequence failed (None when all passed)."""
    report = {
        "passed": not any(r.problems for r in results),
        **runtimes,
        "sequences": [r.to_json() for r in results],
    }
    text = json.dumps(report, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    failed = [f"{r.name}: {p}" for r in results for p in r.problems]
    if not failed:
        return None
    return GenerationCheckError(f"{label} check failed: {'; '.join(failed)}")


def _decodes(
    trace_dir: Path, evaluate_dir: Path, names: tuple[str, str, str, str]
) -> tuple[Any, Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(reference, exported, reference arrays, exported arrays)`` read from the reference's
    and the decode's ``.json`` and ``.npz`` (``names``: in that order)."""
    ref_json, got_json, ref_npz, got_npz = names
    reference = json.loads((trace_dir / ref_json).read_text(encoding="utf-8"))
    exported = json.loads((evaluate_dir / got_json).read_text(encoding="utf-8"))
    return reference, exported, read_npz(trace_dir / ref_npz), read_npz(evaluate_dir / got_npz)


def judge_generation(
    trace_dir: Path, evaluate_dir: Path, out_dir: Path, min_distinct: int = MIN_DISTINCT
) -> tuple[list[SequenceResult], GenerationCheckError | None]:
    """Judge ``task: text-generation``'s decode and write ``generation_check.json``.

    Returns:
        The results per sequence, and the error to raise when any failed (None when all
        passed); the caller raises it once its own report is written.
    """
    reference, exported, ref_arrays, got_arrays = _decodes(
        trace_dir,
        evaluate_dir,
        (GENERATION_REFERENCE_JSON, GENERATED_JSON, GENERATION_REFERENCE_NPZ, GENERATED_NPZ),
    )
    results = [
        compare(
            f"prompt {i}",
            want,
            exported["single"][i],
            ref_arrays[f"single.{i}"],
            got_arrays[f"single.{i}"],
            min_distinct,
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
                min_distinct,
            )
        )
    runtimes = {"runtime": exported["runtime"], "batch_runtime": exported["batch_runtime"]}
    error = _verdict_file(results, runtimes, out_dir / GENERATION_CHECK, "generation")
    return results, error


def judge_seq2seq(
    trace_dir: Path, evaluate_dir: Path, out_dir: Path, min_distinct: int = MIN_DISTINCT
) -> tuple[list[SequenceResult], GenerationCheckError | None]:
    """Judge an encoder-decoder's decode and write ``seq2seq_check.json``.

    Returns:
        The results per prompt, and the error to raise when any failed (None when all passed);
        the caller raises it once its own report is written.
    """
    reference, exported, ref_arrays, got_arrays = _decodes(
        trace_dir,
        evaluate_dir,
        (SEQ2SEQ_REFERENCE_JSON, SEQ2SEQ_DECODED_JSON, SEQ2SEQ_REFERENCE_NPZ, SEQ2SEQ_DECODED_NPZ),
    )
    results = []
    for i, want in enumerate(reference["tokens"]):
        result = compare(
            f"prompt {i}",
            want,
            exported["tokens"][i],
            ref_arrays[f"logits.{i}"],
            got_arrays[f"logits.{i}"],
            min_distinct,
        )
        if len(want) < MIN_STEPS:
            result.problems.append(
                f"the reference ends after {len(want)} steps (< {MIN_STEPS}): "
                "choose other prompts or seeds"
            )
        results.append(result)
    error = _verdict_file(
        results, {"runtime": exported["runtime"]}, out_dir / SEQ2SEQ_CHECK, "seq2seq"
    )
    return results, error


def verdict(r: SequenceResult, what: str = "tokens identical") -> str:
    """What the comparison of one sequence found, as the check judged it: ``16 tokens
    identical`` when it passed; else ``FAILED: 6 of 16 tokens identical: <each problem>``."""
    if not r.problems:
        return f"{len(r.exported)} {what}"
    same = len(r.reference) if r.first_divergence is None else r.first_divergence
    return f"FAILED: {same} of {len(r.reference)} {what}: {'; '.join(r.problems)}"


def summary_lines(
    results: Sequence[SequenceResult], label: str = "generation", what: str = "tokens identical"
) -> list[str]:
    """One line per sequence for ``check.txt``: ``<label> <sequence>: <verdict>, ...``."""
    return [
        f"{label} {r.name}: {verdict(r, what)}, max logits diff "
        f"{max(r.max_diff_per_step, default=0.0):.2e}, min top-2 gap {r.min_top2_gap:.2e}"
        for r in results
    ]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (``(steps, vocab)``)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)
    dots = np.einsum("sv,sv->s", a64, b64)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 1.0)


def _quantized_sequence(
    name: str, quantized: np.ndarray, floats: np.ndarray, float_tokens: Sequence[int] | None
) -> dict[str, Any]:
    """One sequence of the quantized decode (logits fed the float decode's tokens) against the
    float decode's logits ``(steps, vocab)``; ``float_tokens`` (free-running compared) or None."""
    steps = min(len(quantized), len(floats))
    same = quantized[:steps].argmax(-1) == floats[:steps].argmax(-1)
    cosines = _cosines(quantized[:steps], floats[:steps])
    return {
        "name": name,
        "steps": steps,
        "agreeing_steps": int(same.sum()),
        "token_agreement": float(same.mean()) if steps else 1.0,
        "cosine_per_step": [round(float(c), 6) for c in cosines],
        "min_cosine": float(cosines.min()) if steps else 1.0,
    }


def judge_quantized_generation(
    evaluate_dir: Path, gates: QuantizedDecodeGates
) -> QuantizedDecodeVerdict | None:
    """The quantized model's decode (``generation_quantized.*``: its logits along the float
    decode's tokens, and its free-running tokens) against the float model's decode
    (``generation.*``): the share of steps where both pick the same next token, and each step's
    logits cosine, over the prompts and the padded batch's rows. None: no quantized decode."""
    if not (evaluate_dir / GENERATED_QUANTIZED_JSON).is_file():
        return None
    floats = json.loads((evaluate_dir / GENERATED_JSON).read_text(encoding="utf-8"))
    quantized = json.loads((evaluate_dir / GENERATED_QUANTIZED_JSON).read_text(encoding="utf-8"))
    f_arrays = read_npz(evaluate_dir / GENERATED_NPZ)
    q_arrays = read_npz(evaluate_dir / GENERATED_QUANTIZED_NPZ)
    sequences = []
    for i, tokens in enumerate(floats["single"]):
        seq = _quantized_sequence(
            f"prompt {i}", q_arrays[f"single.{i}"], f_arrays[f"single.{i}"], tokens
        )
        free = quantized["free_running"][i]
        seq["free_running"] = free
        seq["free_running_same"] = next(
            (k for k, (a, b) in enumerate(zip(free, tokens)) if a != b), min(len(free), len(tokens))
        )
        sequences.append(seq)
    for row in range(len(floats["batch"])):
        sequences.append(
            _quantized_sequence(
                f"padded batch row {row}",
                q_arrays["batch"][:, row],
                f_arrays["batch"][:, row],
                None,
            )
        )
    steps = sum(s["steps"] for s in sequences)
    agreement = sum(s["agreeing_steps"] for s in sequences) / steps if steps else 1.0
    min_cosine = min((s["min_cosine"] for s in sequences), default=1.0)
    failed = []
    if agreement < gates.min_token_agreement:
        failed.append(f"token agreement {agreement:.3f} < {gates.min_token_agreement}")
    if min_cosine < gates.min_decode_cosine:
        failed.append(f"logits cosine {min_cosine:.4f} < {gates.min_decode_cosine}")
    passed = not failed or not gates.gate
    if not gates.gate:
        under = f"; under the gates: {'; '.join(failed)}" if failed else ""
        state = f"reported, not gated (check.quantized.decode: report{under})"
    else:
        state = "FAILED: " + "; ".join(failed) if failed else "passed"
    lines = [
        f"quantized decode {state}: {QUANTIZED_MODEL_NAME} fed the float decode's tokens, "
        f"token agreement {agreement:.3f} over {steps} steps, least logits cosine "
        f"{min_cosine:.4f}",
    ]
    for s in sequences:
        free = ""
        if "free_running" in s:
            free = (
                f"; free-running, the first {s['free_running_same']} tokens as the float decode's"
            )
        lines.append(
            f"  quantized decode {s['name']}: {s['agreeing_steps']}/{s['steps']} steps agree, "
            f"least cosine {s['min_cosine']:.4f}{free}"
        )
    report = {
        "passed": passed,
        "gate": gates.gate,
        "thresholds": {
            "min_token_agreement": gates.min_token_agreement,
            "min_decode_cosine": gates.min_decode_cosine,
        },
        "runtime": quantized["runtime"],
        "batch_runtime": quantized["batch_runtime"],
        "token_agreement": agreement,
        "min_cosine": min_cosine,
        "failed": failed,
        "sequences": sequences,
    }
    error = None
    if failed and gates.gate:
        error = CheckError(f"quantized decode check failed: {'; '.join(failed)}")
    return QuantizedDecodeVerdict(report, tuple(lines), error)


class TextGenerationJudge:
    """``task: text-generation``'s :class:`~hyperexport.library.tasks.task.TaskJudge`: the decode in
    onnxruntime-genai against transformers', and ``genai_config.json`` against the model's
    config."""

    def vouch(self, trace_dir: Path, quantize_dir: Path) -> Vouched:
        from hyperexport.library.tasks.genai_config import genai_config_problems

        problems = genai_config_problems(trace_dir, quantize_dir)
        return Vouched(
            report={"genai_config": {"passed": not problems, "problems": problems}},
            lines=tuple(problems or [f"{GENAI_CONFIG}: ok, as the model's config gives"]),
            problems=tuple(problems),
        )

    def judge(
        self, trace_dir: Path, evaluate_dir: Path, out_dir: Path, min_distinct: int = MIN_DISTINCT
    ) -> tuple[list[str], Exception | None]:
        results, error = judge_generation(trace_dir, evaluate_dir, out_dir, min_distinct)
        return summary_lines(results), error

    def judge_quantized(
        self, evaluate_dir: Path, gates: QuantizedDecodeGates
    ) -> QuantizedDecodeVerdict | None:
        return judge_quantized_generation(evaluate_dir, gates)


class EncoderDecoderJudge:
    """The encoder-decoders' :class:`~hyperexport.library.tasks.task.TaskJudge`: the decode through
    both graphs against transformers', token for token."""

    def vouch(self, trace_dir: Path, quantize_dir: Path) -> Vouched:
        return Vouched(report={}, lines=(), problems=())

    def judge_quantized(
        self, evaluate_dir: Path, gates: QuantizedDecodeGates
    ) -> QuantizedDecodeVerdict | None:
        return None  # validation refuses quantize.method for the encoder-decoders

    def judge(
        self, trace_dir: Path, evaluate_dir: Path, out_dir: Path, min_distinct: int = MIN_DISTINCT
    ) -> tuple[list[str], Exception | None]:
        results, error = judge_seq2seq(trace_dir, evaluate_dir, out_dir, min_distinct)
        what = "decode steps through the graphs identical to transformers"
        return summary_lines(results, "seq2seq", what), error


#: The check stage's part of every task that decodes, by name.
JUDGES: dict[str, TaskJudge] = {
    TEXT_GENERATION: TextGenerationJudge(),
    TEXT2TEXT_GENERATION: EncoderDecoderJudge(),
    SPEECH_RECOGNITION: EncoderDecoderJudge(),
}


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

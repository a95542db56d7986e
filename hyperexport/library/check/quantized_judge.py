"""Judge a :class:`~hyperexport.library.check.quantized.QuantizedComparison` under ``check.quantized.*``.

numpy-free and ONNX-free: the check stage imports it without loading any ONNX library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hyperexport.base.errors import CheckError
from hyperexport.library.check.quantized_record import Closeness, QuantizedComparison
from hyperexport.library.defaults import DEFAULT_MAX_REL_ERROR, DEFAULT_MIN_COSINE, DEFAULT_MIN_TOP1


@dataclass(frozen=True)
class QuantizedThresholds:
    """``check.quantized.*`` (meaning: ``config/schema.py`` ``QuantizedCheckSpec``)."""

    min_cosine: float = DEFAULT_MIN_COSINE
    max_rel_error: float = DEFAULT_MAX_REL_ERROR
    min_top1: float = DEFAULT_MIN_TOP1


def _failures(c: Closeness, t: QuantizedThresholds) -> list[str]:
    if c.error:
        return [c.error]
    failed = []
    if c.cosine < t.min_cosine:
        failed.append(f"cosine {c.cosine:.4f} < {t.min_cosine}")
    if c.rel_error > t.max_rel_error:
        failed.append(f"rel_error {c.rel_error:.4f} > {t.max_rel_error}")
    if c.top1 is not None and c.top1 < t.min_top1:
        failed.append(f"top1 {c.top1:.3f} < {t.min_top1}")
    return failed


def _line(c: Closeness, failed: list[str]) -> str:
    where = f"function {c.module_path} ({c.function})" if c.function else f"output {c.name}"
    if c.error:
        return f"{where}: FAILED {c.error}"
    top1 = f" top1={c.top1:.3f}" if c.top1 is not None else ""
    state = "FAILED " + "; ".join(failed) if failed else "ok"
    return f"{where}: {state} rel_error={c.rel_error:.4g} cosine={c.cosine:.5f}{top1}"


@dataclass(frozen=True)
class QuantizedVerdict:
    """The judged comparison: a line per output and per call site, and the worst layer."""

    comparison: QuantizedComparison
    thresholds: QuantizedThresholds
    failed: tuple[str, ...]
    lines: tuple[str, ...]
    worst: Closeness | None

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "thresholds": vars(self.thresholds),
            "failed": list(self.failed),
            "worst_function": self.worst.module_path if self.worst else None,
            "comparison": self.comparison.to_json(),
        }

    def summary_lines(self) -> list[str]:
        c = self.comparison
        state = "passed" if self.passed else f"FAILED ({len(self.failed)})"
        head = [f"quantized check {state}: {c.method} against the float model, both in ORT"]
        if self.worst is not None:
            head.append(
                f"  largest error: {self.worst.module_path} ({self.worst.function}) "
                f"rel_error={self.worst.rel_error:.4g} cosine={self.worst.cosine:.5f}"
            )
        for function, ops in sorted(c.ops.items()):
            counts = ", ".join(f"{op} x{n}" for op, n in ops.items())
            head.append(f"  quantized ops in {function}: {counts}")
        return head + [f"  {line}" for line in self.lines]

    def raise_for_failure(self) -> None:
        if self.failed:
            worst = f"; largest error in {self.worst.module_path}" if self.worst else ""
            raise CheckError(f"quantized check failed: {self.failed[0]}{worst}")


def judge_quantized(
    comparison: QuantizedComparison, thresholds: QuantizedThresholds
) -> QuantizedVerdict:
    """Apply the thresholds to every output and call site; name the layer with the largest error."""
    failed: list[str] = []
    lines: list[str] = []
    for c in (*comparison.outputs, *comparison.functions):
        problems = _failures(c, thresholds)
        line = _line(c, problems)
        lines.append(line)
        if problems:
            failed.append(line)
    ran = [c for c in comparison.functions if not c.error]
    worst = max(ran, key=lambda c: c.rel_error) if ran else None
    return QuantizedVerdict(comparison, thresholds, tuple(failed), tuple(lines), worst)

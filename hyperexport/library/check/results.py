"""The check report: frozen results per structural check, per graph output and per function call."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hyperexport.base.errors import CheckError, override
from hyperexport.library.check.settings import CheckSettings


def _num(value: float | None) -> float | str | None:
    """A float for JSON: non-finite values become strings (``"inf"``, ``"nan"``)."""
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


@dataclass(frozen=True)
class StructuralResult:
    """One structural check.

    Attributes:
        name: Short identifier of the check (``checker``, ``domains``, ...).
        ok: Whether the check passed.
        detail: What was found (every problem, or a short confirmation).
    """

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class TensorResult:
    """One compared tensor: a graph output, or one output of one function call.

    Attributes:
        name: Graph output name, or the function output's position (``output 0``).
        key: Capture tensor key of the reference array.
        ok: Whether every element is within tolerance (and shape, dtype and NaNs agree).
        max_abs: Largest absolute difference (None when not comparable).
        max_rel: Largest ``|actual - expected| / |expected|`` over non-zero expected elements.
        atol: Absolute tolerance applied.
        rtol: Relative tolerance applied.
        mismatched: Number of elements out of tolerance.
        size: Number of elements compared.
        error: Why the tensors could not be compared element by element, if so.
        vacuous: Why the reference proves nothing (``vacuous.py``: NaN, within the tolerance
            of zero, constant), if so. Such a result fails unless ``accepted`` or ``exact``.
        accepted: Whether the settings accept this output's vacuous reference by name.
        exact: The reference is one value in every element, ONNX Runtime computed exactly the
            same, and a sibling output (of the same call, or of the graph) proves something:
            judged by equality, said as such (``vacuous.py``, "constant by design").
    """

    name: str
    key: str
    ok: bool
    max_abs: float | None
    max_rel: float | None
    atol: float
    rtol: float
    mismatched: int = 0
    size: int = 0
    error: str | None = None
    vacuous: str | None = None
    accepted: bool = False
    exact: bool = False

    @property
    def diverges(self) -> bool:
        """Whether the export differs from the reference (not only a refused vacuous one)."""
        return self.error is not None or self.mismatched > 0

    def describe(self) -> str:
        """One line: name, key, verdict and numbers."""
        label = self.name if self.name == self.key else f"{self.name} [{self.key}]"
        verdict = "ok" if self.ok else "FAIL"
        if self.error is not None:
            return f"{label}: {verdict}: {self.error}"
        if self.exact:
            return f"{label}: ok: {self.vacuous}"
        if self.vacuous is not None and not self.accepted:
            return (
                f"{label}: FAIL: the torch reference {self.vacuous}, so comparing with it proves "
                "nothing; to accept it, list it in check.accept_vacuous: "
                f"{override('check.accept_vacuous', [self.name])}"
            )
        note = "" if self.vacuous is None else f" [vacuous reference accepted: {self.vacuous}]"
        return (
            f"{label}: {verdict} max_abs={_fmt(self.max_abs)} max_rel={_fmt(self.max_rel)} "
            f"(atol={self.atol:g}, rtol={self.rtol:g}; {self.mismatched}/{self.size} out of tolerance)"
            f"{note}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "ok": self.ok,
            "max_abs": _num(self.max_abs),
            "max_rel": _num(self.max_rel),
            "atol": self.atol,
            "rtol": self.rtol,
            "mismatched": self.mismatched,
            "size": self.size,
            "error": self.error,
            "vacuous": self.vacuous,
            "accepted": self.accepted,
            "exact": self.exact,
        }


@dataclass(frozen=True)
class FunctionResult:
    """The per-function check of one call site.

    Attributes:
        call_id: The captured call (``"<path>#<n>"``).
        module_path: Module path of the instance.
        class_name: Qualified class of the module (empty when the manifest does not say).
        domain: Domain of the called function.
        function: Name of the called function.
        ok: Whether the call ran and every output is within tolerance.
        outputs: One result per function output.
        error: Why the function could not be run, if so.
        reason: ``scope`` (selected by ``function_scope``) or ``localisation`` (run to find the
            module behind an end-to-end failure).
        seconds: Wall time of building the standalone model and running it.
    """

    call_id: str
    module_path: str
    class_name: str
    domain: str
    function: str
    ok: bool
    outputs: tuple[TensorResult, ...]
    error: str | None = None
    reason: str = "scope"
    seconds: float = 0.0

    @property
    def diverges(self) -> bool:
        """Whether the call failed (not only on vacuous references, which need no localising)."""
        failed = [o for o in self.outputs if not o.ok]
        vacuous_only = self.error is None and bool(failed) and not any(o.diverges for o in failed)
        return not self.ok and not vacuous_only

    @property
    def max_abs(self) -> float | None:
        """Largest absolute difference over the outputs (None if nothing was compared)."""
        values = [o.max_abs for o in self.outputs if o.max_abs is not None]
        return max(values) if values else None

    def describe(self) -> str:
        """One line naming the module, the function and the worst difference."""
        head = f"{self.module_path} ({self.call_id}, {self.domain}::{self.function})"
        if self.error is not None:
            return f"{head}: FAIL: {self.error}"
        if self.ok:
            exact = [o.name for o in self.outputs if o.exact]
            note = f" ({', '.join(exact)}: constant in torch, equal exactly)" if exact else ""
            return f"{head}: ok max_abs={_fmt(self.max_abs)}{note}"
        bad = "; ".join(o.describe() for o in self.outputs if not o.ok)
        return f"{head}: FAIL: {bad}"

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "module_path": self.module_path,
            "class_name": self.class_name,
            "domain": self.domain,
            "function": self.function,
            "ok": self.ok,
            "max_abs": _num(self.max_abs),
            "outputs": [o.to_json() for o in self.outputs],
            "error": self.error,
            "reason": self.reason,
        }


class CheckFailure(CheckError):
    """A check failed. Carries the report and, when localised, the guilty module path."""

    def __init__(self, message: str, report: CheckReport) -> None:
        self.report = report
        self.module_path = report.first_divergent_module
        super().__init__(message)


@dataclass(frozen=True)
class CheckReport:
    """Everything the check stage found.

    Attributes:
        model_path: The checked model file.
        settings: The settings used.
        structural: Structural checks, in the order they ran.
        outputs: End-to-end results, one per graph output.
        end_to_end_error: Why the end-to-end run could not happen, if so.
        end_to_end_skipped: Why the end-to-end run was not attempted (not enough memory for
            the whole model), if so; the functions are then all checked instead.
        functions: Per-function results, in execution order.
        unchecked_calls: Call ids that got no per-function check.
        first_divergent_module: Module path of the first call, in execution order, whose function
            diverges and none of whose nested calls diverge (None when no function diverges).
        first_divergent_call: The call id of that call.
        timings: ``(phase, seconds)`` pairs.
    """

    model_path: str
    settings: CheckSettings
    structural: tuple[StructuralResult, ...]
    outputs: tuple[TensorResult, ...]
    end_to_end_error: str | None
    functions: tuple[FunctionResult, ...]
    unchecked_calls: tuple[str, ...]
    first_divergent_module: str | None
    first_divergent_call: str | None
    timings: tuple[tuple[str, float], ...] = ()
    end_to_end_skipped: str | None = None

    @property
    def structural_ok(self) -> bool:
        return all(s.ok for s in self.structural)

    @property
    def end_to_end_ok(self) -> bool:
        return self.end_to_end_error is None and all(o.ok for o in self.outputs)

    @property
    def functions_ok(self) -> bool:
        return all(f.ok for f in self.functions)

    @property
    def ok(self) -> bool:
        """True when every structural, end-to-end and per-function check passed."""
        return self.structural_ok and self.end_to_end_ok and self.functions_ok

    def to_json(self) -> dict[str, Any]:
        """JSON-compatible form (non-finite numbers as strings)."""
        return {
            "ok": self.ok,
            "model_path": self.model_path,
            "settings": self.settings.to_json(),
            "structural": [s.to_json() for s in self.structural],
            "end_to_end": {
                "ok": self.end_to_end_ok,
                "error": self.end_to_end_error,
                "skipped": self.end_to_end_skipped,
                "outputs": [o.to_json() for o in self.outputs],
            },
            "functions": [f.to_json() for f in self.functions],
            "unchecked_calls": list(self.unchecked_calls),
            "first_divergent_module": self.first_divergent_module,
            "first_divergent_call": self.first_divergent_call,
        }

    def summary_lines(self) -> list[str]:
        """Human-readable summary: a verdict line, then every check with its numbers."""
        n_struct = sum(s.ok for s in self.structural)
        n_out = sum(o.ok for o in self.outputs)
        n_fn = sum(f.ok for f in self.functions)
        lines = [
            f"check {'passed' if self.ok else 'FAILED'}: structure {n_struct}/{len(self.structural)}"
            f", outputs {n_out}/{len(self.outputs)}, functions {n_fn}/{len(self.functions)}"
            f" ({len(self.unchecked_calls)} calls unchecked)"
        ]
        lines += [
            f"  structure {s.name}: {'ok' if s.ok else 'FAIL'}: {s.detail}" for s in self.structural
        ]
        if self.end_to_end_error is not None:
            lines.append(f"  end-to-end: FAIL: {self.end_to_end_error}")
        if self.end_to_end_skipped is not None:
            lines.append(f"  end-to-end: SKIPPED: {self.end_to_end_skipped}")
        lines += [f"  output {o.describe()}" for o in self.outputs]
        lines += [f"  function {f.describe()}" for f in self.functions]
        if self.first_divergent_module is not None:
            lines.append(
                f"  first divergent module: {self.first_divergent_module} "
                f"(call {self.first_divergent_call})"
            )
        elif any(o.diverges for o in self.outputs):
            lines.append("  no function diverges: the difference comes from the main graph")
        return lines

    def failure_message(self) -> str | None:
        """The error message of a failed check (None when the check passed)."""
        if self.ok:
            return None
        problems = [f"structure {s.name}: {s.detail}" for s in self.structural if not s.ok]
        if self.end_to_end_error is not None:
            problems.append(f"end-to-end run failed: {self.end_to_end_error}")
        problems += [f"output {o.describe()}" for o in self.outputs if not o.ok]
        if self.first_divergent_call is not None:
            guilty = next(f for f in self.functions if f.call_id == self.first_divergent_call)
            problems.append(
                f"first divergent module in execution order: {self.first_divergent_module!r}: "
                f"function {guilty.describe()}"
            )
        others = [
            f for f in self.functions if f.diverges and f.call_id != self.first_divergent_call
        ]
        if others:
            problems.append(
                f"{len(others)} other diverging call(s): " + ", ".join(f.call_id for f in others)
            )
        vacuous = [o for f in self.functions if not f.diverges for o in f.outputs if not o.ok]
        if vacuous:
            problems.append(
                f"{len(vacuous)} function output(s) whose torch reference proves nothing: "
                + ", ".join(f"{o.key} ({o.vacuous})" for o in vacuous)
                + "; to accept them, list them in check.accept_vacuous (beside any the recipe "
                + f"lists): {override('check.accept_vacuous', [o.key for o in vacuous])}"
            )
        return f"check of {self.model_path} failed: " + "; ".join(problems)

    def raise_for_failure(self) -> None:
        """Raise :class:`CheckFailure` (a ``CheckError``) when any check failed."""
        message = self.failure_message()
        if message is not None:
            raise CheckFailure(message, self)

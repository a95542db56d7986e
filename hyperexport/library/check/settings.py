"""What the check stage verifies and how strictly: tolerances, function scope, expectations."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from hyperexport.base.contracts.names import FUNCTION_SCOPES as FUNCTION_SCOPES
from hyperexport.library.defaults import DEFAULT_ATOL, DEFAULT_FUNCTION_SCOPE, DEFAULT_RTOL


@dataclass(frozen=True)
class Tolerance:
    """An elementwise closeness criterion: ``|actual - expected| <= atol + rtol * |expected|``.

    Attributes:
        atol: Absolute tolerance.
        rtol: Relative tolerance.
    """

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        if self.atol < 0 or self.rtol < 0:
            raise ValueError(f"tolerances must be >= 0, got atol={self.atol}, rtol={self.rtol}")


@dataclass(frozen=True)
class CheckSettings:
    """Settings of :func:`hyperexport.library.check.run_checks`.

    Attributes:
        atol: Default absolute tolerance of every compared tensor.
        rtol: Default relative tolerance of every compared tensor.
        per_output: ``(name, Tolerance)`` overrides; ``name`` is a graph output name or a
            capture tensor key (a root output ``out.<i>`` or a call's ``<call_id>/out.<i>``).
        function_scope: Which call sites get a per-function check: ``all``, ``first_instance``
            (the first call of the first instance of each class) or ``none``. When end-to-end
            parity fails, unchecked calls are still checked to localise the divergence.
        expected_classes: Qualified hiera class names that must appear as functions.
        expected_opset: Default-domain opset the final model must import, if set.
        expected_dynamo: Export path the model's metadata must record, if set.
        expected_ops: ``(op type, count)`` pairs: the exact number of default-domain nodes of
            that type the model executes (main graph, plus each function's nodes times the
            number of times it is called). Checked by the ``op_counts`` structural check, which
            runs only when this is non-empty.
        accept_vacuous: Graph output names or capture keys (or ``fnmatch`` patterns of them,
            ``layer.*/out.*``) whose reference may prove nothing (NaN, within the tolerance of
            zero, or constant: ``vacuous.py``); any other such output fails the check.
    """

    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    per_output: tuple[tuple[str, Tolerance], ...] = ()
    function_scope: str = DEFAULT_FUNCTION_SCOPE
    expected_classes: tuple[str, ...] = ()
    expected_opset: int | None = None
    expected_dynamo: bool | None = None
    expected_ops: tuple[tuple[str, int], ...] = ()
    accept_vacuous: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.function_scope not in FUNCTION_SCOPES:
            raise ValueError(
                f"function_scope must be one of {FUNCTION_SCOPES}, got {self.function_scope!r}"
            )
        Tolerance(self.atol, self.rtol)  # validates the defaults

    @property
    def default_tolerance(self) -> Tolerance:
        """The tolerance used where no override applies."""
        return Tolerance(self.atol, self.rtol)

    def tolerance_for(self, *names: str) -> Tolerance:
        """The tolerance of a tensor known by ``names`` (output name, capture key).

        The first override matching any of ``names`` wins; overrides are searched in order.
        """
        for name, tolerance in self.per_output:
            if name in names:
                return tolerance
        return self.default_tolerance

    def accepts_vacuous(self, *names: str) -> bool:
        """Whether an entry of ``accept_vacuous`` names (or matches) any of ``names``."""
        return any(fnmatchcase(name, entry) for entry in self.accept_vacuous for name in names)

    def to_json(self) -> dict[str, object]:
        """JSON-compatible form, for the report."""
        return {
            "atol": self.atol,
            "rtol": self.rtol,
            "per_output": [[n, {"atol": t.atol, "rtol": t.rtol}] for n, t in self.per_output],
            "function_scope": self.function_scope,
            "expected_classes": list(self.expected_classes),
            "expected_opset": self.expected_opset,
            "expected_dynamo": self.expected_dynamo,
            "expected_ops": {op: count for op, count in self.expected_ops},
            "accept_vacuous": list(self.accept_vacuous),
        }

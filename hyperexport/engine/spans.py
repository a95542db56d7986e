"""Named parts of a step's wall time: where a long step spends it, for the build's report.

A step marks a part of its work with :func:`span`; the runner collects the parts of each step
it runs (:func:`collecting`) and reports them beside the step's own time. A span outside any
collection costs a clock read and is dropped. Nested spans of the same name add up; spans are
not exclusive of one another (a span inside another counts in both).

This is for work a reader wants to see apart from the rest of a step: a verification inside a
step that produces something else (a reference run that a later comparison needs), or a part
whose cost grows with the model while the rest does not.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping

_collected: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "collected_spans", default=None
)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, float]]:
    """Collect the spans of the work inside: ``{name: wall seconds}``, filled as spans end."""
    spans: dict[str, float] = {}
    token = _collected.set(spans)
    try:
        yield spans
    finally:
        _collected.reset(token)


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """Time the work inside as ``name`` in the enclosing :func:`collecting` (if any)."""
    if not name:
        raise ValueError("a span needs a name")
    spans = _collected.get()
    start = time.perf_counter()
    try:
        yield
    finally:
        if spans is not None:
            spans[name] = spans.get(name, 0.0) + time.perf_counter() - start


def describe(spans: Mapping[str, float]) -> str:
    """``{name: seconds}`` as people read it: ``reference decode 10.47s, other 1.00s``."""
    return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in spans.items())

"""One entry of a recipe's ``inputs``, as data: what a task (text generation, seq2seq) or
``inputs: auto`` writes into the recipe it resolves. ``config.schema.InputSpec`` validates it
like any other entry."""

from __future__ import annotations

from typing import Any


def input_spec(
    shape: list[int],
    check_shape: list[int] | None,
    dtype: str,
    low: float,
    high: float,
    seed: int,
    dynamic: dict[int, str],
) -> dict[str, Any]:
    """The ``inputs.<name>`` mapping of one example input (see ``InputSpec`` for the fields)."""
    return {
        "shape": shape,
        "dtype": dtype,
        "low": low,
        "high": high,
        "seed": seed,
        "dynamic": dynamic,
        "check_shape": check_shape,
    }

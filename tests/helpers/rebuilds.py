"""What a recipe build's rebuild should do, stage by stage (product stages; the engine's own
tests use :mod:`tests.helpers.statuses` alone, which imports no product code)."""

from __future__ import annotations

from hyperexport.base.contracts.names import STAGE_NAMES


def reran_from(first: str) -> dict[str, str]:
    """The statuses of a rebuild whose change reaches stage ``first``: every stage before it a
    ``hit``, it and every stage after it ``ran``."""
    start = STAGE_NAMES.index(first)
    return {name: "hit" if i < start else "ran" for i, name in enumerate(STAGE_NAMES)}

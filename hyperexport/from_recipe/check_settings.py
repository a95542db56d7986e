"""The check's :class:`~hyperexport.check.CheckSettings` from a recipe slice.

Two stages read them: ``evaluate`` the expectations and the function scope (what to run),
``check`` the tolerances as well (how to judge). Each reads only its own slice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from hyperexport.check.settings import CheckSettings, Tolerance


def expectations(
    params: Mapping[str, Any], hiera: tuple[str, ...], fallback_from: str | None = None
) -> CheckSettings:
    """What the final model must declare, and which functions run alone; no tolerance is read.

    Args:
        params: A slice holding ``check.function_scope``, ``check.expect_ops``, ``opset``,
            ``dynamo``, ``fallback`` and ``attention.promote_opset24``.
        hiera: Qualified hiera class names (each must become a function).
        fallback_from: The manifest's record of a fallback, if the export fell back. Only a
            recipe with ``fallback: true`` accepts the other path; otherwise the metadata check
            fails on it.

    The expectations follow from the recipe:

    * default-domain opset: ``opset``, or 24 with ``attention.promote_opset24`` (promotion
      raises the model to 24 whatever the export opset);
    * export path (metadata): ``dynamo``, or the other path when ``fallback`` is on and the
      manifest records that the export fell back;
    * ``check.expect_ops``: executed counts of default-domain op types (``op_counts``).
    """
    c = params["check"]
    promote = bool((params.get("attention") or {}).get("promote_opset24"))
    dynamo = bool(params["dynamo"])
    if fallback_from is not None and params.get("fallback"):
        dynamo = not dynamo
    return CheckSettings(
        function_scope=c["function_scope"],
        expected_classes=tuple(hiera),
        expected_opset=24 if promote else int(params["opset"]),
        expected_dynamo=dynamo,
        expected_ops=tuple(sorted((op, int(n)) for op, n in (c.get("expect_ops") or {}).items())),
    )


def check_settings(
    params: Mapping[str, Any], hiera: tuple[str, ...], fallback_from: str | None = None
) -> CheckSettings:
    """:func:`expectations` plus the tolerances (``check.atol``, ``check.rtol``, ``per_output``)."""
    c = params["check"]
    per_output = tuple(
        (name, Tolerance(t.get("atol") or c["atol"], t.get("rtol") or c["rtol"]))
        for name, t in sorted((c.get("per_output") or {}).items())
    )
    return dataclasses.replace(
        expectations(params, hiera, fallback_from),
        atol=float(c["atol"]),
        rtol=float(c["rtol"]),
        per_output=per_output,
    )

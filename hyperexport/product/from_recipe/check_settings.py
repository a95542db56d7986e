"""The check's :class:`~hyperexport.library.check.CheckSettings` from the typed recipe, in one place.

Two stages read them: ``evaluate`` the expectations and the function scope (what to run),
``check`` the tolerances as well (how to judge). Each passes its own slice: the tolerances
are set only when the slice holds them, so changing one reruns only ``check``.
"""

from __future__ import annotations

import dataclasses

from hyperexport.base.contracts.names import PROMOTED_OPSET, STANDARD_FUSION
from hyperexport.library.check.quantized_judge import QuantizedThresholds
from hyperexport.library.check.settings import CheckSettings, Tolerance
from hyperexport.library.defaults import DECODE_GATES
from hyperexport.library.tasks.task import QuantizedDecodeGates
from hyperexport.product.config.fields import is_read
from hyperexport.product.config.schema import RecipeConfig


def check_settings(
    recipe: RecipeConfig, hiera: tuple[str, ...], fallback_from: str | None = None
) -> CheckSettings:
    """The settings of the checks from the recipe (or a stage's slice of it).

    Args:
        recipe: Holds ``check.function_scope``, ``check.expect_ops``, ``opset``, ``dynamo``,
            ``fallback`` and ``rewrite.fuse``; and, for the ``check`` stage,
            ``check.atol``, ``check.rtol``, ``check.per_output`` and ``check.accept_vacuous``.
        hiera: Qualified hiera class names (each must become a function).
        fallback_from: The manifest's record of a fallback, if the export fell back. Only a
            recipe with ``fallback: true`` accepts the other path; otherwise the metadata check
            fails on it.

    The expectations follow from the recipe:

    * default-domain opset: ``opset``, or 24 with ``rewrite.fuse=standard`` (the fusion
      raises the model to 24 whatever the export opset);
    * export path (metadata): ``dynamo``, or the other path when ``fallback`` is on and the
      manifest records that the export fell back;
    * ``check.expect_ops``: executed counts of op types (``op_counts``).
    """
    c = recipe.check
    dynamo = recipe.dynamo
    if fallback_from is not None and recipe.fallback:
        dynamo = not dynamo
    settings = CheckSettings(
        function_scope=c.function_scope,
        expected_classes=tuple(hiera),
        expected_opset=PROMOTED_OPSET if recipe.rewrite.fuse == STANDARD_FUSION else recipe.opset,
        expected_dynamo=dynamo,
        expected_ops=tuple(sorted(c.expect_ops.items())),
    )
    if not is_read(c, "atol"):  # evaluate: no tolerance
        return settings
    per_output = tuple(
        (name, Tolerance(t.atol or c.atol, t.rtol or c.rtol))
        for name, t in sorted(c.per_output.items())
    )
    return dataclasses.replace(
        settings,
        atol=c.atol,
        rtol=c.rtol,
        per_output=per_output,
        accept_vacuous=tuple(c.accept_vacuous),
    )


def quantized_thresholds(recipe: RecipeConfig) -> QuantizedThresholds:
    """``check.quantized.*`` as the judge of the quantized model takes them."""
    t = recipe.check.quantized
    return QuantizedThresholds(t.min_cosine, t.max_rel_error, t.min_top1)


def quantized_decode_gates(recipe: RecipeConfig) -> QuantizedDecodeGates:
    """``check.quantized``'s gates of a quantized model's decode (``task: text-generation``)."""
    t = recipe.check.quantized
    return QuantizedDecodeGates(
        t.min_token_agreement, t.min_decode_cosine, gate=t.decode == DECODE_GATES[0]
    )

"""The library's frozen :class:`~hyperexport.library.options.ExportOptions` from the typed recipe (and,
for the export stage, the trace's frozen capture specification)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperexport.base.contracts.capture_spec import CaptureSpec, DynamicAxes, ProbeShapes
from hyperexport.library.options import (
    AttentionOptions,
    CustomOpSymbolic,
    ExportOptions,
    RewriteOptions,
)
from hyperexport.product.config.fields import is_read, to_json
from hyperexport.product.config.schema import InputSpec, RecipeConfig


def dynamic_axes(inputs: Mapping[str, InputSpec]) -> DynamicAxes:
    """``((input, ((axis, dim name), ...)), ...)`` of the inputs with ``dynamic`` axes."""
    return tuple(
        (name, tuple((int(axis), str(dim)) for axis, dim in sorted(spec.dynamic.items())))
        for name, spec in inputs.items()
        if spec.dynamic
    )


def probe_shapes(inputs: Mapping[str, InputSpec]) -> ProbeShapes:
    """``((input, check_shape), ...)`` of the inputs that set ``check_shape``."""
    return tuple(
        (name, tuple(int(d) for d in spec.check_shape))
        for name, spec in inputs.items()
        if spec.check_shape is not None
    )


def export_options(recipe: RecipeConfig, spec: CaptureSpec | None = None) -> ExportOptions:
    """The one place recipe fields become the library's :class:`ExportOptions`.

    Args:
        recipe: The typed recipe, or a stage's slice of it: fields the slice does not hold
            keep the library's defaults (the rewrite stage reads no ``method``).
        spec: The trace's capture specification (``auto`` resolved there), for the method,
            the dynamic axes and the probe shapes the capture was made with; None: none.
    """
    kwargs: dict[str, Any] = {}
    if is_read(recipe, "functions"):
        kwargs["functions"] = recipe.functions
    if is_read(recipe, "method"):
        kwargs["method"] = recipe.method
    if is_read(recipe, "fallback"):
        kwargs["fallback"] = recipe.fallback
    if is_read(recipe, "custom_ops"):
        kwargs["custom_ops"] = tuple(
            CustomOpSymbolic(op.name, op.symbolic, op.opset) for op in recipe.custom_ops
        )
    if is_read(recipe, "rewrite"):
        kwargs["rewrite"] = RewriteOptions(**to_json(recipe.rewrite))
    if is_read(recipe, "attention"):
        kwargs["attention"] = AttentionOptions(**to_json(recipe.attention))
    if is_read(recipe, "external_data_threshold"):
        kwargs["external_data_threshold"] = recipe.external_data_threshold
    if spec is not None:
        kwargs["method"] = spec.method
        kwargs["dynamic_axes"] = spec.dynamic_axes
        kwargs["probe_shapes"] = spec.probe_shapes
    return ExportOptions(**kwargs)

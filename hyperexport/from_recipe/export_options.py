"""The library's frozen :class:`~hyperexport.options.ExportOptions` from the typed recipe, and
the stages' other typed views of it (explicit inputs after ``auto``, example tensors)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperexport.config.fields import from_json, is_read, to_json
from hyperexport.config.schema import InputSpec, RecipeConfig
from hyperexport.options import (
    AttentionOptions,
    CustomOpSymbolic,
    ExportOptions,
    RewriteOptions,
)

DynamicAxes = tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
ProbeShapes = tuple[tuple[str, tuple[int, ...]], ...]


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


def export_options(
    recipe: RecipeConfig, inputs: Mapping[str, InputSpec] | None = None
) -> ExportOptions:
    """The one place recipe fields become the library's :class:`ExportOptions`.

    Args:
        recipe: The typed recipe, or a stage's slice of it: fields the slice does not hold
            keep the library's defaults (the rewrite stage reads no ``method``).
        inputs: The explicit input specs (``inputs: auto`` resolved), for the dynamic axes
            and the probe shapes; None: none.
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
    if inputs is not None:
        kwargs["dynamic_axes"] = dynamic_axes(inputs)
        kwargs["probe_shapes"] = probe_shapes(inputs)
    return ExportOptions(**kwargs)


@dataclass(frozen=True)
class Explicit:
    """A stage's ``inputs`` and ``hiera`` with ``auto`` resolved on the live model.

    Attributes:
        inputs: ``{input name: spec}``.
        hiera: Import paths of the hiera classes.
    """

    inputs: dict[str, InputSpec]
    hiera: list[str]

    def example_inputs(self) -> dict[str, Any]:
        """The example inputs as torch tensors (deterministic from each spec's seed)."""
        from hyperexport.models.inputs import make_inputs

        return make_inputs({name: to_json(spec) for name, spec in self.inputs.items()})


def resolve_explicit(
    recipe: RecipeConfig, model: Any, recipe_file: str, out_dir: Path | None = None
) -> Explicit:
    """``recipe.inputs``/``recipe.hiera``, ``auto`` resolved on ``model`` (``auto.json`` in
    ``out_dir`` when given; see :func:`hyperexport.models.auto.resolve_auto`)."""
    from hyperexport.models.auto import resolve_auto

    data = resolve_auto(to_json(recipe), model, recipe_file, out_dir)
    typed = from_json(RecipeConfig, data, partial=True)
    inputs, hiera = typed.inputs, typed.hiera
    assert not isinstance(inputs, str) and not isinstance(hiera, str), "auto left unresolved"
    return Explicit(inputs=inputs, hiera=list(hiera))

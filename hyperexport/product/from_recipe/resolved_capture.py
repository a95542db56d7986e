"""The trace's frozen :class:`~hyperexport.base.contracts.capture_spec.CaptureSpec` from the typed
recipe, ``auto`` resolved on the live model (once, by the trace), and its example tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hyperexport.base.contracts.capture_spec import CaptureSpec, InputEntry
from hyperexport.product.config.fields import from_json, to_json
from hyperexport.product.config.schema import InputSpec, RecipeConfig
from hyperexport.product.from_recipe.export_options import dynamic_axes, probe_shapes


def capture_spec(
    recipe: RecipeConfig, model: Any, recipe_file: str, out_dir: Path | None = None
) -> CaptureSpec:
    """The recipe's capture, with ``inputs``/``hiera``/``dynamic: auto`` resolved on ``model``.

    Args:
        recipe: The trace stage's typed slice (``inputs``, ``hiera``, ``dynamic``, ``method``,
            ``dynamo``, ``attention``).
        model: The live model (as the stage runs it: the step model for text-generation).
        recipe_file: For error messages.
        out_dir: Where ``auto.json`` (what ``auto`` became, and why) is written, if anything
            was ``auto`` (:func:`hyperexport.library.models.auto.resolve_auto`).

    Raises:
        RecipeError: ``auto`` cannot be resolved on this model (naming the field).
    """
    from hyperexport.library.models.auto import resolve_auto

    data = resolve_auto(to_json(recipe), model, recipe_file, out_dir)
    typed = from_json(RecipeConfig, data, partial=True)
    inputs, hiera = typed.inputs, typed.hiera
    assert not isinstance(inputs, str) and not isinstance(hiera, str), "auto left unresolved"
    return CaptureSpec(
        hiera=tuple(hiera),
        method=recipe.method,
        dynamo=recipe.dynamo,
        attention=recipe.attention.implementation,
        inputs=tuple(_entry(name, spec) for name, spec in inputs.items()),
        dynamic_axes=dynamic_axes(inputs),
        probe_shapes=probe_shapes(inputs),
    )


def _entry(name: str, spec: InputSpec) -> InputEntry:
    return InputEntry(
        name=name,
        shape=tuple(int(d) for d in spec.shape),
        dtype=spec.dtype,
        low=float(spec.low),
        high=float(spec.high),
        seed=int(spec.seed),
        dynamic=tuple((int(a), str(d)) for a, d in sorted(spec.dynamic.items())),
        check_shape=None if spec.check_shape is None else tuple(int(d) for d in spec.check_shape),
    )


def example_inputs(spec: CaptureSpec) -> dict[str, Any]:
    """The spec's example inputs as torch tensors (deterministic from each input's seed)."""
    from hyperexport.library.models.inputs import make_inputs

    return make_inputs(spec.generators())

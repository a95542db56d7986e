"""Build the library's frozen :class:`~hyperexport.options.ExportOptions` from a recipe slice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperexport.options import AttentionOptions, CustomOpSymbolic, ExportOptions, RewriteOptions

DynamicAxes = tuple[tuple[str, tuple[tuple[int, str], ...]], ...]
ProbeShapes = tuple[tuple[str, tuple[int, ...]], ...]


def dynamic_axes(inputs: Mapping[str, Mapping[str, Any]]) -> DynamicAxes:
    """``((input, ((axis, dim name), ...)), ...)`` of the inputs with ``dynamic`` axes."""
    return tuple(
        (name, tuple((int(axis), str(dim)) for axis, dim in sorted(spec["dynamic"].items())))
        for name, spec in inputs.items()
        if spec.get("dynamic")
    )


def probe_shapes(inputs: Mapping[str, Mapping[str, Any]]) -> ProbeShapes:
    """``((input, check_shape), ...)`` of the inputs that set ``check_shape``."""
    return tuple(
        (name, tuple(int(d) for d in spec["check_shape"]))
        for name, spec in inputs.items()
        if spec.get("check_shape") is not None
    )


def attention_options(attention: Mapping[str, Any] | None) -> AttentionOptions:
    """The recipe's ``attention`` section (absent: leave the model's attention alone)."""
    if not attention:
        return AttentionOptions()
    return AttentionOptions(
        implementation=attention.get("implementation"),
        promote_opset24=bool(attention.get("promote_opset24")),
    )


def export_options(params: Mapping[str, Any]) -> ExportOptions:
    """Options from whichever recipe fields ``params`` holds; absent fields keep their defaults."""
    kwargs: dict[str, Any] = {}
    if "functions" in params:
        kwargs["functions"] = params["functions"]
    if "method" in params:
        kwargs["method"] = params["method"]
    if "fallback" in params:
        kwargs["fallback"] = bool(params["fallback"])
    if "custom_ops" in params:
        kwargs["custom_ops"] = tuple(
            CustomOpSymbolic(op["name"], op["symbolic"], int(op["opset"]))
            for op in params["custom_ops"]
        )
    if "rewrite" in params:
        kwargs["rewrite"] = RewriteOptions(**params["rewrite"])
    if isinstance(params.get("attention"), Mapping):
        kwargs["attention"] = attention_options(params["attention"])
    if "external_data_threshold" in params:
        kwargs["external_data_threshold"] = int(params["external_data_threshold"])
    if "inputs" in params:
        kwargs["dynamic_axes"] = dynamic_axes(params["inputs"])
        kwargs["probe_shapes"] = probe_shapes(params["inputs"])
    return ExportOptions(**kwargs)

"""Build the library's frozen :class:`~hyperexport.options.ExportOptions` from a recipe slice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hyperexport.options import AttentionOptions, CustomOpSymbolic, ExportOptions, RewriteOptions


def export_options(params: Mapping[str, Any]) -> ExportOptions:
    """Options from whichever recipe fields ``params`` holds; absent fields keep their defaults."""
    kwargs: dict[str, Any] = {}
    if "functions" in params:
        kwargs["functions"] = params["functions"]
    if "method" in params:
        kwargs["method"] = params["method"]
    if "custom_ops" in params:
        kwargs["custom_ops"] = tuple(
            CustomOpSymbolic(op["name"], op["symbolic"], int(op["opset"]))
            for op in params["custom_ops"]
        )
    if "rewrite" in params:
        kwargs["rewrite"] = RewriteOptions(**params["rewrite"])
    if isinstance(params.get("attention"), Mapping):
        kwargs["attention"] = AttentionOptions(
            **{
                k: v
                for k, v in params["attention"].items()
                if k in ("implementation", "promote_opset24")
            }
        )
    if "external_data_threshold" in params:
        kwargs["external_data_threshold"] = int(params["external_data_threshold"])
    if "inputs" in params:
        kwargs["dynamic_axes"] = tuple(
            (
                name,
                tuple(
                    (int(axis), str(dim)) for axis, dim in sorted(spec.get("dynamic", {}).items())
                ),
            )
            for name, spec in params["inputs"].items()
            if spec.get("dynamic")
        )
    return ExportOptions(**kwargs)

"""Options are validated where they are defined, with typed errors naming the option; the recipe
schema is held against the library's options (same names, choices and defaults)."""

from __future__ import annotations

import dataclasses
import inspect
import io

import pytest
import torch

from hyperexport import (
    AttentionOptions,
    CustomOpSymbolic,
    ExportOptions,
    OpsetError,
    OptionsError,
    RewriteOptions,
    export_hyper_onnx,
)
from hyperexport.base import versions
from hyperexport.library.defaults import DEFAULT_OPSET
from hyperexport.library.options import BUILTIN_ATTENTION, FUNCTION_MODES, ExportRequest
from hyperexport.product.config import schema


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"functions": "per-instance"}, "ExportOptions.functions"),
        ({"fallback": "yes"}, "ExportOptions.fallback"),
        ({"rewrite": {"optimize": True}}, "ExportOptions.rewrite"),
        ({"attention": "hyperexport"}, "ExportOptions.attention"),
        ({"external_data_threshold": -1}, "ExportOptions.external_data_threshold"),
        ({"dynamic_axes": {"x": {0: "1 bad"}}}, "ExportOptions.dynamic_axes['x'][0]"),
        ({"dynamic_axes": {"x": {-1: "batch"}}}, "ExportOptions.dynamic_axes['x']"),
        ({"probe_shapes": {"x": (2, "3")}}, "ExportOptions.probe_shapes['x']"),
        ({"method": "not a method"}, "ExportOptions.method"),
        ({"custom_ops": ("a::b",)}, "ExportOptions.custom_ops"),
    ],
)
def test_export_options_reject_bad_values_by_name(kwargs: dict, field: str) -> None:
    with pytest.raises(OptionsError) as info:
        ExportOptions(**kwargs)
    assert info.value.field == field


def test_nested_options_are_validated_too() -> None:
    with pytest.raises(OptionsError, match=r"RewriteOptions\.optimize"):
        RewriteOptions(optimize="no")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="built-in"):
        AttentionOptions("sdpa")
    with pytest.raises(OptionsError, match=r"RewriteOptions\.fuse"):
        RewriteOptions(fuse="onnx")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="domain::op"):
        CustomOpSymbolic("noop", "pkg.mod:fn", 18)
    with pytest.raises(OptionsError, match=r"CustomOpSymbolic\.opset"):
        CustomOpSymbolic("a::b", "pkg.mod:fn", "18")  # type: ignore[arg-type]


def test_mappings_are_normalised_to_the_frozen_item_form() -> None:
    options = ExportOptions(dynamic_axes={"x": {1: "seq", 0: "batch"}}, probe_shapes={"x": [3, 5]})  # type: ignore[arg-type]
    assert options.dynamic_axes == (("x", ((0, "batch"), (1, "seq"))),)
    assert options.probe_shapes == (("x", (3, 5)),)
    assert hash(options)  # still hashable: nothing mutable inside


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"dynamo": "yes"}, OptionsError, "export_hyper_onnx.dynamo"),
        ({"opset_version": "18"}, OptionsError, "opset_version"),
        ({"options": {"functions": "per_type"}}, OptionsError, "options"),
        ({"f": None}, OptionsError, "f"),
        ({"f": io.StringIO()}, OptionsError, "f"),
        ({"input_names": "x"}, OptionsError, "input_names"),
        ({"output_names": ["y", "y"]}, OptionsError, "output_names"),
        ({"opset_version": 21}, OpsetError, None),
    ],
)
def test_export_arguments_are_checked_before_the_model_runs(
    kwargs: dict, error: type, field: str | None
) -> None:
    calls = []

    class Spy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(x)
            return x + 1

    arguments = {"f": io.BytesIO(), "dynamo": False, **kwargs}
    with pytest.raises(error) as info:
        export_hyper_onnx(Spy(), (torch.ones(2, 3),), **arguments)
    assert not calls
    if field is not None:
        assert info.value.field == field


def test_dynamic_axis_beyond_the_inputs_rank_is_named() -> None:
    class Flat(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    with pytest.raises(OptionsError, match="axis 5 is beyond the input's rank 2") as info:
        export_hyper_onnx(
            Flat(), (torch.ones(2, 3),), io.BytesIO(), dynamo=False, dynamic_axes={"x": {5: "d"}}
        )
    assert info.value.field == "dynamic_axes['x']"


def test_request_accepts_paths_and_binary_files(tmp_path) -> None:
    assert ExportRequest(f=tmp_path / "m.onnx", opset_version=18, dynamo=True).dynamo is True
    with open(tmp_path / "m.onnx", "wb") as handle:
        ExportRequest(f=handle, opset_version=24, dynamo=True)


# --- the recipe schema is held against the library's options -------------------------------


def _defaults(cls: type) -> dict[str, object]:
    instance = cls()
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(cls)}


def test_recipe_function_modes_are_the_library_s() -> None:
    assert tuple(schema.FUNCTION_MODES) == FUNCTION_MODES
    assert schema.RecipeConfig().functions == ExportOptions().functions


@pytest.mark.parametrize(
    ("spec", "options"),
    [(schema.RewriteSpec, RewriteOptions), (schema.AttentionSpec, AttentionOptions)],
)
def test_recipe_sections_match_the_library_options(spec: type, options: type) -> None:
    assert _defaults(spec) == _defaults(options)


def test_recipe_custom_ops_and_shared_fields_match() -> None:
    assert [f.name for f in dataclasses.fields(schema.CustomOpSpec)] == [
        f.name for f in dataclasses.fields(CustomOpSymbolic)
    ]
    recipe, library = schema.RecipeConfig(), ExportOptions()
    for name in ("fallback", "functions", "method", "external_data_threshold"):
        assert getattr(recipe, name) == getattr(library, name), name
    defaults = inspect.signature(export_hyper_onnx).parameters
    # Both 18, or the torch's TorchScript cap where lower: the library resolves its None so.
    assert defaults["opset_version"].default is None
    assert recipe.opset == versions.torchscript_opset(DEFAULT_OPSET)
    # No default export path in a recipe (issue 20): the field is required.
    assert recipe.dynamo == schema.REQUIRED
    assert recipe.external_data == defaults["external_data"].default
    assert tuple(schema.BUILTIN_ATTENTION) == BUILTIN_ATTENTION


def test_dynamo_has_no_default_and_its_absence_names_the_argument_and_both_values() -> None:
    ran = []

    class Spy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            ran.append(x)
            return x

    with pytest.raises(OptionsError) as info:
        export_hyper_onnx(Spy(), (torch.ones(2, 3),), io.BytesIO())
    assert info.value.field == "dynamo"
    assert "dynamo=True" in str(info.value) and "dynamo=False" in str(info.value)
    assert not ran

"""Issue 34: a recipe missing several fields took one try per field; now one exit 2 names all."""

from __future__ import annotations

import pytest

from hyperexport.base.errors import RecipeError, RecipeErrors
from hyperexport.product.config.validate import validate_recipe

MODEL = {"_target_": "hyperexport.models.pretrained", "path": "/m", "auto_class": "AutoModel"}


def test_every_missing_unknown_and_invalid_field_is_named_in_one_error() -> None:
    data = {"model": MODEL, "opsett": 17, "check": {"atol": -1.0}}
    with pytest.raises(RecipeErrors) as e:
        validate_recipe(data, "/r/mine.yaml")
    fields = [err.field for err in e.value.errors]
    assert fields == ["opsett", "inputs", "hiera", "dynamo", "check.atol"]  # name: the stem
    lines = str(e.value).splitlines()
    assert lines[0] == "recipe /r/mine.yaml: 5 fields refused:"
    assert lines[1] == "  field 'opsett': unknown key; did you mean 'opset'?"
    assert "  field 'dynamo': missing required field (true or false)" in lines
    assert e.value.field == "opsett"  # a RecipeError still: the first field, for callers


def test_one_problem_reads_as_before() -> None:
    data = {"name": "x", "model": MODEL, "inputs": "auto", "hiera": "auto"}
    with pytest.raises(RecipeError) as e:
        validate_recipe(data, "/r/mine.yaml")
    assert str(e.value) == (
        "recipe /r/mine.yaml: field 'dynamo': missing required field (true or false)"
    )

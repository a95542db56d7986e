"""``from_recipe/model.py`` resolves a recipe's hiera classes with the library's one resolver and
names the recipe entry when one is unusable."""

from __future__ import annotations

import pytest
import torch

from hyperexport.base.errors import RecipeError
from hyperexport.product.from_recipe.model import resolve_classes


def test_both_spellings_resolve_to_the_class() -> None:
    assert resolve_classes(["torch.nn:Linear", "torch.nn.ReLU"], "r.yaml") == [
        torch.nn.Linear,
        torch.nn.ReLU,
    ]


def test_a_misspelt_class_names_the_entry_and_a_close_match() -> None:
    with pytest.raises(RecipeError, match=r"field 'hiera\[1\]'.*did you mean 'Linear'") as e:
        resolve_classes(["torch.nn.ReLU", "torch.nn.Linaer"], "r.yaml")
    assert e.value.recipe == "r.yaml"


def test_a_class_that_is_not_a_module_is_refused_as_a_recipe_error() -> None:
    with pytest.raises(RecipeError, match=r"field 'hiera\[0\]'.*not a torch.nn.Module subclass"):
        resolve_classes(["torch.Tensor"], "r.yaml")

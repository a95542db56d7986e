"""The recipe fields task and generation.* are validated before anything runs (exit 2)."""

from __future__ import annotations

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.product.config import compose_recipe
from tests.helpers.release_skips import NEEDS_DECODING_TASKS


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["task=text-generaton"], "task"),
        # checked once the task is (a transformers before 4.57 refuses the task first)
        pytest.param(["generation.prompts=[]"], "generation.prompts", marks=NEEDS_DECODING_TASKS),
        (["generation.prompts=[[3,4],[]]"], "generation.prompts[1]"),
        (["generation.max_new_tokens=0"], "generation.max_new_tokens"),
    ],
)
def test_bad_generation_fields_are_refused_naming_them(overrides: list[str], field: str) -> None:
    with pytest.raises(RecipeError) as info:
        compose_recipe(["recipe=zoo_llama_generate", *overrides])
    assert info.value.field == field


def test_a_recipe_without_task_keeps_the_forward_default() -> None:
    recipe, _ = compose_recipe(["recipe=zoo_llama"])
    assert recipe.data["task"] == "forward" and recipe.data["generation"]["prompts"] == []

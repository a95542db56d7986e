"""Issue 34: a recipe without ``name`` takes its file's stem (``recipe_file=my_model.yaml`` with no
``name`` stopped on the missing field); a stem that is no safe name is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperexport.base.errors import RecipeError
from hyperexport.base.exit_codes import INVALID
from hyperexport.product.config.validate import validate_recipe
from tests.helpers.cli import TOY_RECIPE, run_here, write_toy

RECIPE = {
    "model": {"_target_": "hyperexport.zoo.tiny_llama"},
    "inputs": "auto",
    "hiera": "auto",
    "dynamo": False,
}


def test_a_recipe_without_name_takes_its_files_stem() -> None:
    assert validate_recipe(RECIPE, "/r/my_model.yaml").name == "my_model"
    assert validate_recipe(RECIPE, "/r/my-model.v2.yml").name == "my-model.v2"


def test_a_name_given_wins_over_the_stem() -> None:
    assert validate_recipe({**RECIPE, "name": "other"}, "/r/my_model.yaml").name == "other"


def test_a_stem_that_is_no_name_is_one_line_saying_to_set_name() -> None:
    with pytest.raises(RecipeError) as e:
        validate_recipe(RECIPE, "/r/my model.yaml")
    assert str(e.value) == (
        "recipe /r/my model.yaml: field 'name': missing, and the file's stem cannot stand in "
        "for it: 'my model' may only contain letters, digits, '_', '.', '-'; set name:"
    )


def test_no_recipe_file_no_stand_in() -> None:
    with pytest.raises(RecipeError, match="field 'name': missing required field"):
        validate_recipe(RECIPE, "<command line>")


@pytest.mark.slow  # a dry run imports torch to key the trace: a few seconds
def test_recipe_file_without_name_builds_under_its_stem(tmp_path: Path) -> None:
    recipe = write_toy(tmp_path)
    mine = recipe.with_name("my_model.yaml")
    mine.write_text(TOY_RECIPE.replace("name: toy\n", ""))
    proc = run_here([f"recipe_file={mine}", "build.dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "my_model" in proc.stdout + proc.stderr


def test_recipe_file_with_an_unsafe_stem_exits_2_naming_name(tmp_path: Path) -> None:
    recipe = write_toy(tmp_path)
    mine = recipe.with_name("my model.yaml")
    mine.write_text(TOY_RECIPE.replace("name: toy\n", ""))
    proc = run_here([f"recipe_file={mine}", "build.dry_run=true"], tmp_path)
    assert proc.returncode == INVALID, proc.stdout + proc.stderr
    assert "field 'name': missing, and the file's stem cannot stand in" in proc.stderr

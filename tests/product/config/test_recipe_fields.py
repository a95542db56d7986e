"""Each recipe field is declared once: readers, derived reads, the typed recipe and its slices."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest

import hyperexport.product.stages as stages_package
from hyperexport.base.contracts.names import STAGE_NAMES
from hyperexport.engine.stage import config_slice
from hyperexport.product.config.fields import (
    UnreadFieldError,
    defaults_of,
    from_json,
    leaves,
    readers_of,
    to_json,
)
from hyperexport.product.config.schema import RecipeConfig, stage_reads
from hyperexport.product.stages import PIPELINE
from hyperexport.product.stages.recipe_stage import RecipeStage
from tests.helpers.recipes import USABLE
from tests.helpers.recipes import composed as compose_once

RECIPES = USABLE  # the ones this transformers composes (tests/test_configs.py: the others)
SECTIONS = {path.split(".")[0] for path, _ in leaves(RecipeConfig) if "." in path}


@pytest.fixture(scope="module")
def composed() -> dict[str, Any]:
    return {name: compose_once(name)[0] for name in RECIPES}


def test_every_declared_reader_is_a_stage() -> None:
    readers = readers_of(RecipeConfig)
    unknown = {path: r for path, r in readers.items() if not set(r) <= set(STAGE_NAMES)}
    assert not unknown
    assert {s for r in readers.values() for s in r} == set(STAGE_NAMES)


def test_every_recipe_holds_exactly_the_declared_fields(composed: dict[str, Any]) -> None:
    """Composed and validated, every recipe has one value per declared field, and every path
    a stage reads names a declared field (or a whole section of them)."""
    declared = {path for path, _ in leaves(RecipeConfig)}
    sections = {p.rsplit(".", 1)[0] for p in declared if "." in p}
    sections |= {".".join(s.split(".")[:i]) for s in sections for i in range(1, s.count(".") + 1)}

    def held(data: dict[str, Any], prefix: str = "") -> set[str]:
        found: set[str] = set()
        for key, value in data.items():
            path = f"{prefix}{key}"
            found |= held(value, f"{path}.") if path in sections else {path}
        return found

    for name, recipe in composed.items():
        assert held(dict(recipe.data)) == declared, name
    for stage in PIPELINE:
        for path in stage.reads:
            assert path in declared or path in sections, (stage.name, path)


def test_stage_reads_are_derived_from_the_schema() -> None:
    for stage in PIPELINE:
        assert stage.reads == stage_reads(stage.name), stage.name
        assert isinstance(stage, RecipeStage)


def test_typed_recipe_serialises_to_the_same_data(composed: dict[str, Any]) -> None:
    """The runner keys the JSON slice: the typed object must round-trip to the same data."""
    for name, recipe in composed.items():
        assert to_json(recipe.config) == dict(recipe.data), name
        for stage in PIPELINE:
            params = config_slice(recipe.data, stage.reads)
            assert to_json(from_json(RecipeConfig, params, partial=True)) == params, stage.name


def test_a_stage_cannot_read_a_field_it_does_not_declare(composed: dict[str, Any]) -> None:
    recipe = composed["tiny_llama"]
    evaluate = from_json(
        RecipeConfig, config_slice(recipe.data, stage_reads("evaluate")), partial=True
    )
    assert evaluate.check.function_scope == recipe.data["check"]["function_scope"]
    with pytest.raises(UnreadFieldError, match=r"CheckSpec\.atol is not in this stage's reads"):
        _ = evaluate.check.atol
    with pytest.raises(UnreadFieldError, match=r"RecipeConfig\.model"):
        _ = evaluate.model


def test_defaults_are_the_dataclass_defaults() -> None:
    defaults = defaults_of(RecipeConfig)
    instance = RecipeConfig()
    for f in dataclasses.fields(RecipeConfig):
        assert to_json(getattr(instance, f.name)) == defaults[f.name], f.name


def _indexes_params(tree: ast.AST) -> list[int]:
    """Lines where a name ``params`` is subscripted or ``.get``-ed."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "params":
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "get"
            and getattr(node.value, "id", None) == "params"
        ):
            lines.append(node.lineno)
    return lines


def test_no_stage_indexes_params_with_strings() -> None:
    """Stages implement ``run_recipe(recipe: RecipeConfig, ...)``: typed attributes only."""
    folder = Path(stages_package.__file__).parent
    for path in sorted(folder.glob("*.py")):
        assert not _indexes_params(ast.parse(path.read_text(encoding="utf-8"))), path.name
    for stage in PIPELINE:
        assert "run" not in type(stage).__dict__, f"{stage.name} overrides RecipeStage.run"
        assert type(stage).run_recipe is not RecipeStage.run_recipe, stage.name


def test_check_defaults_are_the_check_library_s() -> None:
    """The schema cannot import the check library (the stages that do not check would be keyed
    on it), so the two defaults are held together here."""
    from hyperexport.library.check.settings import CheckSettings
    from hyperexport.product.config.schema import CheckSpec

    recipe, library = CheckSpec(), CheckSettings()
    for name in ("atol", "rtol", "function_scope"):
        assert getattr(recipe, name) == getattr(library, name), name

"""The zoo table (docs/building.md) is what bench/zoo_table.py renders from the recipes and the last
measurement (bench/zoo_table.json): adding, removing or changing a zoo recipe without measuring
again fails here."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from hyperexport.zoo import expected_failures
from tests.helpers.recipes import RECIPES, USABLE
from tests.helpers.scripts import load_script


def _script() -> ModuleType:
    return load_script("bench/zoo_table.py")


def test_every_zoo_recipe_was_measured_on_both_paths() -> None:
    table = _script()
    measured = json.loads(table.RESULTS.read_text())
    results = measured["recipes"]
    assert sorted(results) == table.zoo_recipes()
    # The expected failures of the transformers and torch releases the table was measured on.
    environment = measured["environment"]
    failures = expected_failures(environment["transformers"], environment["torch"])
    for name, entry in results.items():
        for label, dynamo in table.PATHS:
            result = entry[label]
            expected = failures.get((name, dynamo))
            if expected:
                assert result == {"ok": False, "expected_failure": expected}
            else:
                assert result["ok"], (name, label, result)
                assert result["max_abs"] <= 1e-4, (name, label)


def test_the_docs_table_is_up_to_date() -> None:
    # the table composes every zoo recipe: where the installed releases refuse one (a later
    # transformers' class, the dynamo path), tests/test_configs.py checks that refusal instead
    if refused := sorted(set(RECIPES) - set(USABLE)):
        pytest.skip(f"{len(refused)} recipes refused by the installed releases ({refused[0]}, ...)")
    table = _script()
    results = json.loads(table.RESULTS.read_text())["recipes"]
    rendered = table.render_table(table.zoo_recipes(), results)
    current = table.doc_table(table.TABLE_DOC.read_text())
    assert current == rendered, "run: python bench/zoo_table.py --measure"

"""Issue 34: docs/recipe-reference.md is generated from the schema's declarations; a field added,
retyped, re-defaulted or re-documented without regenerating it fails here."""

from __future__ import annotations

import pytest

from hyperexport.product.config.fields import leaves
from hyperexport.product.config.reference import REFERENCE, render_reference
from hyperexport.product.config.schema import RecipeConfig
from tests.helpers.cli import REPO


# The schema's defaults as the installed releases evaluate them: opset's is 17 where torch's
# TorchScript stops there (versions.torchscript_opset); the committed page is the pinned stack's.
@pytest.mark.pinned_stack
def test_the_committed_reference_is_what_the_schema_renders() -> None:
    committed = (REPO / REFERENCE).read_text(encoding="utf-8")
    assert committed == render_reference(), (
        f"{REFERENCE} is stale: run python -m hyperexport.product.config.reference"
    )


def test_every_field_has_a_row_with_its_meaning() -> None:
    text = render_reference()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for path, _ in leaves(RecipeConfig):
        name = path.rsplit(".", 1)[-1]
        assert any(row.startswith(f"| `{name}` |") for row in rows), f"{path}: no row"
    empty = [row for row in rows if row.endswith("|  |")]
    assert not empty, f"fields without doc= in schema.py: {empty}"
    for nested in ("## `inputs.<name>`", "## `check.per_output.<name>`", "## `custom_ops[i]`"):
        assert nested in text


def test_the_readme_and_the_recipes_readme_link_it() -> None:
    for doc in ("README.md", "recipes/README.md"):
        assert "recipe-reference.md" in (REPO / doc).read_text(encoding="utf-8"), doc

"""The "Tested versions" table (docs/versions.md) is what bench/versions_table.py renders from the matrix's
committed results (bench/versions/*.json): a leg run again without regenerating it fails here."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from types import ModuleType

from tests.helpers.scripts import load_script

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    return load_script("bench/versions_table.py")


def test_the_docs_table_is_up_to_date() -> None:
    table = _script()
    results = table.load_results()
    assert results, "no result file under bench/versions/"
    current = table.doc_table(table.TABLE_DOC.read_text())
    assert current == table.render_table(results), "run: python bench/versions_table.py"


def test_every_result_names_its_leg_and_installed_versions() -> None:
    table = _script()
    for leg, result in table.load_results().items():
        assert result["leg"] == leg
        assert set(table.COLUMNS) <= set(result["installed"])
        for name, version in result["pins"].items():  # the leg got what it asked for
            assert result["installed"][name].split("+")[0] == version, (leg, name)


def test_pyproject_floors_are_the_floors_leg() -> None:
    tree = ast.parse((REPO / "noxfile.py").read_text())
    floors = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and "FLOORS"
        in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    for spec in [*project["dependencies"], *project["optional-dependencies"]["transformers"]]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec)
        if match:
            declared[match[1]] = match[2]
    for name, release in floors.items():
        # the floor leg's release is the declared floor's major.minor (a patch release of it)
        assert release.startswith(declared[name] + ".") or release == declared[name], name


def test_every_result_is_of_its_leg_as_noxfile_defines_it_today() -> None:
    """A leg redefined (its floors lowered) leaves no row of its old stack under its name."""
    noxfile = load_script("noxfile.py", "noxfile_legs")
    for leg, result in _script().load_results().items():
        assert leg in noxfile.LEGS, f"bench/versions/{leg}.json: no such leg in noxfile.py"
        assert result["pins"] == noxfile.LEGS[leg], f"{leg}: run again (its pins changed)"

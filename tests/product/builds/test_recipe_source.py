"""A build never replaces a publication made from another recipe source (issue 32, case 7):
``outputs/<name>/`` belongs to one recipe file, and a recipe of the same name from another file
stops before any stage runs, with exit code 3 naming both files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hyperexport.product.builds.publish import check_same_source
from hyperexport.product.builds.recipe_source import ForeignRecipeError, recipe_source
from hyperexport.product.builds.report import REPORT
from hyperexport.product.builds.session import run_build
from hyperexport.product.config import RECIPES_DIR, BuildSettings, Recipe
from tests.engine.fakes import StageBoom, pipeline
from tests.helpers.fake_recipe import recipe

REPO = Path(__file__).resolve().parents[3]


def _settings(tmp_path: Path) -> BuildSettings:
    return BuildSettings(
        cache_dir=str(tmp_path / "cache"), outputs_dir=tmp_path / "outputs", dry_run=False, force=()
    )


def _from(file: Path, **overrides: object) -> Recipe:
    return replace(recipe(**overrides), file=str(file))


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def test_a_recipe_of_the_same_name_from_another_file_is_refused(tmp_path: Path) -> None:
    mine, other = tmp_path / "a" / "fake.yaml", tmp_path / "b" / "fake.yaml"
    first = run_build(_from(mine), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    assert first.exit_code == 0
    report = json.loads((first.out_dir / REPORT).read_text())
    assert report["recipe"]["source"] == str(mine.resolve())
    outputs = tmp_path / "outputs"
    before = _tree(outputs)

    refused = run_build(
        _from(other, rewrite__optimize=True),
        _settings(tmp_path),
        stages=pipeline(),
        load_model=lambda: "m",
    )
    assert refused.exit_code == 3
    assert refused.result.stages == []  # before any stage ran
    assert _tree(outputs) == before  # the other recipe's publication is as it was

    again = run_build(
        _from(mine, rewrite__optimize=True),
        _settings(tmp_path),
        stages=pipeline(),
        load_model=lambda: "m",
    )
    assert again.exit_code == 0  # its own source publishes as before


def test_the_refusal_names_both_recipe_files(tmp_path: Path) -> None:
    mine, other = tmp_path / "a" / "fake.yaml", tmp_path / "b" / "fake.yaml"
    run_build(_from(mine), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m")
    with pytest.raises(ForeignRecipeError) as info:
        check_same_source(tmp_path / "outputs" / "fake", str(other))
    assert str(mine) in str(info.value) and str(other) in str(info.value)
    assert "cache clean fake --yes" in str(info.value)


def test_a_failed_publication_counts_too(tmp_path: Path) -> None:
    stages = [
        replace(s, fail=lambda _params: StageBoom("no")) if s.name == "check" else s
        for s in pipeline()
    ]
    mine, other = tmp_path / "a" / "fake.yaml", tmp_path / "b" / "fake.yaml"
    failed = run_build(_from(mine), _settings(tmp_path), stages=stages, load_model=lambda: "m")
    assert failed.exit_code == 1 and failed.out_dir.name.endswith(".failed")
    refused = run_build(
        _from(other), _settings(tmp_path), stages=pipeline(), load_model=lambda: "m"
    )
    assert refused.exit_code == 3


def _publication(recipe_dir: Path, recipe_block: dict[str, str]) -> None:
    folder = recipe_dir / ".builds" / "default.1"
    folder.mkdir(parents=True)
    (folder / REPORT).write_text(json.dumps({"recipe": recipe_block}))
    os.symlink(os.path.join(".builds", "default.1"), recipe_dir / "default")


def test_a_shipped_recipe_is_the_same_source_from_any_checkout(tmp_path: Path) -> None:
    shipped = RECIPES_DIR / "tiny_llama.yaml"
    assert recipe_source(str(shipped)) == "recipes/tiny_llama.yaml"
    recipe_dir = tmp_path / "tiny_llama"
    elsewhere = "/another/checkout/recipes/tiny_llama.yaml"
    _publication(recipe_dir, {"file": elsewhere, "source": "recipes/tiny_llama.yaml"})
    check_same_source(recipe_dir, str(shipped))  # the shipped recipe, built in another checkout
    with pytest.raises(ForeignRecipeError, match=elsewhere):
        check_same_source(recipe_dir, str(tmp_path / "mine" / "tiny_llama.yaml"))


def test_a_report_without_a_source_is_judged_by_its_file(tmp_path: Path) -> None:
    recipe_dir = tmp_path / "fake"
    _publication(recipe_dir, {"file": str(tmp_path / "a.yaml")})  # written before sources
    check_same_source(recipe_dir, str(tmp_path / "a.yaml"))
    with pytest.raises(ForeignRecipeError):
        check_same_source(recipe_dir, str(tmp_path / "b.yaml"))


def test_a_recipe_file_named_like_a_shipped_recipe_exits_3(tmp_path: Path) -> None:
    """The issue's case from the command line: a recipe file whose name is ``tiny_llama``,
    after the shipped ``tiny_llama`` published (a dry run refuses as the build would)."""
    outputs = tmp_path / "outputs"
    shipped = RECIPES_DIR / "tiny_llama.yaml"
    _publication(
        outputs / "tiny_llama", {"file": str(shipped), "source": "recipes/tiny_llama.yaml"}
    )
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "# @package _global_\ndefaults:\n  - /recipe_base: llama\n  - _self_\nname: tiny_llama\n"
        "model: {num_layers: 1}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hyperexport",
            f"recipe_file={mine}",
            "build.dry_run=true",
            f"build.cache_dir={tmp_path / 'cache'}",
            f"build.outputs_dir={outputs}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3, done.stderr
    assert str(shipped) in done.stderr and str(mine) in done.stderr

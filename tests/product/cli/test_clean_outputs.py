"""``cache clean``: output folders of recipes that are gone, or that the user names."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from hyperexport.product.builds.session import run_build
from hyperexport.product.cli import cache as cache_cli
from hyperexport.product.config import BuildSettings
from tests.engine.fakes import pipeline
from tests.helpers.fake_recipe import recipe


def build(tmp_path: Path, name: str, recipe_file: Path, variant: str = "default") -> Path:
    recipe_file.write_text(f"name: {name}\n")  # only its existence matters to clean
    settings = BuildSettings(str(tmp_path / "cache"), tmp_path / "outputs", False, ())
    built = dataclasses.replace(recipe(name=name), file=str(recipe_file))
    outcome = run_build(built, settings, stages=pipeline(), load_model=lambda: "m", variant=variant)
    assert outcome.exit_code == 0
    return outcome.out_dir


def clean(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = cache_cli.main(["clean", "--outputs-dir", str(tmp_path / "outputs"), *args])
    out, err = capsys.readouterr()
    assert code != 0 or err == ""
    return code, out.splitlines()


def test_clean_lists_then_removes_outputs_of_recipes_that_are_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = build(tmp_path, "kept", tmp_path / "kept.yaml")
    gone_file = tmp_path / "gone.yaml"
    gone = [build(tmp_path, "gone", gone_file, v) for v in ("default", "opset=17")]
    gone_file.unlink()
    (tmp_path / "outputs" / "stray" / "x").mkdir(parents=True)  # no report: never guessed at

    code, lines = clean(tmp_path, capsys)
    assert code == 0
    assert [line.split()[:3] for line in lines[:2]] == [
        ["would", "remove", "gone/default"],
        ["would", "remove", "gone/opset=17"],
    ]
    assert lines[0].endswith(f"recipe file {gone_file} is gone")
    assert lines[2] == "left 1 folders without a readable report.json: stray/x"
    assert lines[3].startswith("would remove 2 of 4 output folders")
    assert lines[3].endswith("(dry run: add --yes to remove)")
    assert all(p.is_dir() for p in gone)

    code, lines = clean(tmp_path, capsys, "--yes")
    assert code == 0
    assert lines[0].startswith("removed  gone/default")
    assert not (tmp_path / "outputs" / "gone").exists()
    assert (kept / "report.json").is_file()
    assert (tmp_path / "outputs" / "stray" / "x").is_dir()


def test_clean_removes_named_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    recipe_file = tmp_path / "mine.yaml"
    default = build(tmp_path, "mine", recipe_file)
    variant = build(tmp_path, "mine", recipe_file, "opset=17")
    code, lines = clean(tmp_path, capsys, "mine/opset=17", "--yes")
    assert code == 0
    assert lines[0].split()[:2] == ["removed", "mine/opset=17"]
    assert lines[0].endswith("named")
    assert not variant.exists()
    assert default.is_dir()

    code, lines = clean(tmp_path, capsys, "mine", "--yes")
    assert code == 0
    assert not (tmp_path / "outputs" / "mine").exists()


def test_clean_refuses_an_unknown_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build(tmp_path, "mine", tmp_path / "mine.yaml")
    code = cache_cli.main(["clean", "mine/opset=99", "--outputs-dir", str(tmp_path / "outputs")])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.strip() == "hyperexport cache clean: no output folder 'mine/opset=99'"


def test_clean_with_an_unusable_outputs_dir_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "outputs").write_text("a file")
    code = cache_cli.main(["clean", "--outputs-dir", str(tmp_path / "outputs")])
    assert code == 3
    assert "is not a directory" in capsys.readouterr().err


def test_clean_removes_a_link_that_points_at_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe_file = tmp_path / "mine.yaml"
    good = build(tmp_path, "mine", recipe_file)
    broken = build(tmp_path, "mine", recipe_file, "opset=17")
    assert broken.is_symlink()  # a published variant is a link into .builds/
    shutil.rmtree(broken.resolve())  # e.g. deleted by hand
    code, lines = clean(tmp_path, capsys)
    assert code == 0
    assert lines[0].split()[:3] == ["would", "remove", "mine/opset=17"]
    assert lines[0].endswith("its link points at nothing")
    code, lines = clean(tmp_path, capsys, "--yes")
    assert not broken.is_symlink()
    assert (good / "report.json").is_file()


def test_clean_reports_what_it_really_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Folders hyperexport did not write are kept, and the summary says so (issue 32)."""
    recipe_file = tmp_path / "mine.yaml"
    ours = build(tmp_path, "mine", recipe_file)
    folder = tmp_path / "outputs" / "mine"
    (folder / "by-hand").mkdir()  # a user's folder, with a report copied in
    (folder / "by-hand" / "report.json").write_text((ours / "report.json").read_text())
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (folder / "a-link").symlink_to(elsewhere)  # a user's link, not into .builds/

    code, lines = clean(tmp_path, capsys, "mine")
    assert code == 0
    assert sorted(line.split()[:3] for line in lines[:3]) == [
        ["would", "keep", "mine/a-link"],
        ["would", "keep", "mine/by-hand"],
        ["would", "remove", "mine/default"],
    ]
    assert lines[3] == "left 1 folders without a readable report.json: mine/a-link"
    assert lines[4].startswith("would remove 1 of 3 output folders")

    code, lines = clean(tmp_path, capsys, "mine", "--yes")
    assert code == 1
    assert sorted(line.split()[:2] for line in lines[:3]) == [
        ["kept", "mine/a-link"],
        ["kept", "mine/by-hand"],
        ["removed", "mine/default"],
    ]
    assert lines[4].startswith("removed 1 of 3 output folders")
    assert lines[5] == "kept 2 chosen folders hyperexport did not write: mine/a-link, mine/by-hand"
    assert not os.path.lexists(folder / "default")
    assert (folder / "by-hand" / "report.json").is_file()
    assert (folder / "a-link").is_symlink() and (elsewhere / "keep.txt").read_text() == "mine"

    code, lines = clean(tmp_path, capsys, "mine", "--yes")  # nothing of ours left
    assert code == 1
    assert lines[3].startswith("removed 0 of 2 output folders")

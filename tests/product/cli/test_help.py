"""``hyperexport --help``: the front door lists commands, recipes and common overrides, and every
flag of every subcommand says what it does."""

from __future__ import annotations

import argparse

import pytest

from hyperexport import __main__ as entry
from hyperexport.product.cli import cache, help, show
from hyperexport.product.config.paths import RECIPES_DIR


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert entry._run(list(args)) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["recipe=llama", "--help"]])
def test_help_lists_commands_recipes_and_overrides(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    text = _help(capsys, *args)
    listed = {line.split()[0] for line in text.splitlines() if line.startswith("  ")}
    assert set(entry.SUBCOMMANDS) <= listed
    recipes = {p.stem for p in RECIPES_DIR.glob("*.yaml")}
    assert recipes and recipes <= listed
    bases = {p.stem for p in (RECIPES_DIR / "base").glob("*.yaml")}
    assert bases and not (bases - recipes) & listed, "recipe bases are not selectable"
    assert "recipe_base" not in text
    for override in ("opset=18", "build.dry_run=true", "build.force=[export]", "build.remote=s3"):
        assert override in text
    assert "--hydra-help" in text


def test_every_command_listed_is_dispatched() -> None:
    assert [c for c, _ in help.SUBCOMMANDS_HELP] == list(entry.SUBCOMMANDS)


def test_a_subcommands_help_is_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert "usage: hyperexport cache" in _help(capsys, "cache", "--help")


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


@pytest.mark.parametrize("build_parser", [cache.build_parser, show.build_parser])
def test_every_flag_of_every_subcommand_has_help(build_parser: object) -> None:
    assert callable(build_parser)
    missing = [
        f"{parser.prog} {action.option_strings or action.dest}"
        for parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not action.help
    ]
    assert missing == []


def test_a_long_summary_is_cut_at_a_word() -> None:
    summaries = dict(help.recipe_summaries(RECIPES_DIR))
    assert all(len(s) <= help.SUMMARY_WIDTH for s in summaries.values())
    assert summaries["tiny_llama"].startswith("The embedded default")

"""Every shell snippet in the README and in docs/ runs as written, so none can rot.

Each ``python -m hyperexport`` / ``hyperexport`` command of a ``bash`` block runs in this
process (:func:`tests.helpers.cli.run_here`) against a temporary cache, outputs folder and lock
file, which the test appends as the command's own flags; a build or a sweep runs as a dry run
(``build.dry_run=true``: composed, validated and keyed, nothing built: the builds themselves are
the other tests'). It must exit 0.

The YAML recipe fragments of docs/ (blocks that set ``model``) name declared recipe fields
only; the README's whole recipes are built by ``tests/test_readme.py``.

A block that needs what a test here cannot have (an S3 bucket, a cluster, the reader's own files,
every recipe built) says so in its first line, ``# not run by the tests: <why>``, and is listed in
:data:`NOT_RUN`, so that marking one is a visible change. The README's "Export your Hugging Face
model" commands are built by ``tests/test_readme.py``, and its two commands are what ``.ci/run``
runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import REPO, run_here
from tests.helpers.path_skips import NEEDS_DYNAMO_PATH
from tests.helpers.release_skips import NEEDS_OPSET_18

DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
#: The marker a block that is not run starts with.
MARKER = "# not run by the tests: "
#: Every block marked as not run: (document, the marker's reason).
NOT_RUN = {
    ("cache.md", "needs an S3 bucket (tests/product/cli/test_cache_sync.py runs one on loopback)"),
    ("cache.md", "builds every recipe (tests/product/cli/test_lock_build.py, slow)"),
    ("cache.md", "names the reader's own recipe file and cache key"),
    ("building.md", "names the reader's own recipe file"),
    ("launchers.md", "needs a SLURM cluster (tests/launchers/test_slurm.py starts one, slow)"),
    ("launchers.md", "needs a SLURM cluster and the reader's Hydra config folder"),
    ("launchers.md", "installs system packages and starts daemons"),
    ("launchers.md", "needs a Ray cluster (tests/launchers/test_ray.py starts one, slow)"),
    ("launchers.md", "installs packages"),
    ("versions.md", "installs a virtualenv per leg (minutes to hours)"),
}
#: The README's sections whose commands other tests run (tests/test_readme.py, .ci/run).
README_TESTED_ELSEWHERE = ("## Two commands", "## Export your Hugging Face model")


@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int
    args: tuple[str, ...]  # after ``python -m hyperexport`` / ``hyperexport``

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: hyperexport {shlex.join(self.args)}"


def _blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, body, line of the body's first line)`` of each fenced block."""
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        out.append((m.group(1), m.group(2), text[: m.start(2)].count("\n") + 1))
    return out


def _tested_elsewhere(text: str, line: int) -> bool:
    """Whether the README's ``line`` sits in a section other tests run."""
    headings = [x for x in text.splitlines()[: line - 1] if x.startswith("## ")]
    return bool(headings) and headings[-1].startswith(README_TESTED_ELSEWHERE)


def _commands(body: str) -> list[tuple[int, list[str]]]:
    """Each command of a shell block (continuation lines joined, comments dropped), with its
    line number in the block."""
    out = []
    joined, first = "", 0
    for i, line in enumerate(body.splitlines()):
        if not joined:
            first = i
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(joined + line, comments=True)
        joined = ""
        if words:
            out.append((first, words))
    return out


def collect() -> tuple[list[Snippet], set[tuple[str, str]], list[str]]:
    """The commands to run, the blocks marked as not run, and commands of unmarked blocks that
    are not hyperexport's (each must be marked)."""
    runs: list[Snippet] = []
    marked: set[tuple[str, str]] = set()
    foreign: list[str] = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for lang, body, start in _blocks(text):
            if lang not in ("bash", "sh", "shell"):
                continue
            if doc.name == "README.md" and _tested_elsewhere(text, start):
                continue
            first = body.splitlines()[0] if body else ""
            if first.startswith(MARKER):
                marked.add((doc.name, first.removeprefix(MARKER).strip()))
                continue
            for at, words in _commands(body):
                if words[:3] == ["python", "-m", "hyperexport"]:
                    args = words[3:]
                elif words[:1] == ["hyperexport"]:
                    args = words[1:]
                else:
                    foreign.append(f"{doc.name}:{start + at}: {shlex.join(words)}")
                    continue
                runs.append(Snippet(doc.name, start + at, tuple(args)))
    return runs, marked, foreign


SNIPPETS, MARKED, FOREIGN = collect()


def test_blocks_not_run_are_marked_and_listed() -> None:
    assert MARKED == NOT_RUN
    assert not FOREIGN, "a command that is not hyperexport's, in a block not marked as not run"
    assert len(SNIPPETS) >= 15  # the building and cache commands at least


def isolated(args: tuple[str, ...], tmp_path: Path) -> list[str]:
    """``args`` with the temporary cache, outputs and lock appended in the command's own flags;
    a build or sweep as a dry run."""
    cache, outputs = tmp_path / "cache", tmp_path / "outputs"
    if args[:1] == ("--version",):
        return list(args)
    if args[:1] == ("cache",):
        if args[1:2] == ("clean",):
            return [*args, "--outputs-dir", str(outputs)]
        return [*args, "--cache-dir", str(cache)]
    if args[:1] == ("lock",):
        lock = tmp_path / "hyperexport.lock"
        return [
            *args,
            "--lock-file",
            str(lock),
            "--cache-dir",
            str(cache),
            "--outputs-dir",
            str(outputs),
        ]
    given = {a.partition("=")[0] for a in args}
    extra = {
        "build.cache_dir": str(cache),
        "build.outputs_dir": str(outputs),
        "build.dry_run": "true",
    }
    return [*args, *(f"{k}={v}" for k, v in extra.items() if k not in given)]


def every_recipe(args: tuple[str, ...]) -> bool:
    """Commands that compose and key every recipe (7-15 s each): slow; the default run keys every
    recipe once already (tests/product/cli/test_lock.py::test_the_committed_lock_is_fresh)."""
    status = args[:2] == ("cache", "status") and not [a for a in args[2:] if not a.startswith("-")]
    return status or args[:1] == ("lock",)


def _release_marks(args: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    """The skips of a command naming what the installed torch lacks: a TorchScript opset of 18
    or more (torch 2.2 stops at 17), the dynamo path (refused below torch 2.6)."""
    values = {a.partition("=")[0]: a.partition("=")[2].split(",") for a in args if "=" in a}
    marks = []
    if any(v.isdigit() and int(v) >= 18 for v in values.get("opset", [])):
        marks.append(NEEDS_OPSET_18)
    if "true" in values.get("dynamo", []):
        marks.append(NEEDS_DYNAMO_PATH)
    return marks


def _cases() -> list[object]:
    seen: set[tuple[str, ...]] = set()
    cases: list[object] = []
    for snippet in SNIPPETS:
        if snippet.args in seen:  # the same command in two documents runs once
            continue
        seen.add(snippet.args)
        marks = [pytest.mark.slow] if every_recipe(snippet.args) else []
        marks += _release_marks(snippet.args)
        cases.append(pytest.param(snippet, marks=marks, id=str(snippet)))
    return cases


def _publish(target: str, tmp_path: Path) -> None:
    """Build ``recipe[/variant]`` for real, so that a command naming its outputs finds them."""
    recipe, _, variant = target.partition("/")
    overrides = [] if variant in ("", "default") else variant.split(",")
    proc = run_here([f"recipe={recipe}", *overrides], tmp_path)
    assert proc.returncode == 0, proc.stderr[-1500:]


@pytest.mark.parametrize("snippet", _cases())
def test_the_snippet_runs_as_written(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.args[:2] == ("cache", "clean"):
        for target in (a for a in snippet.args[2:] if not a.startswith("-")):
            _publish(target, tmp_path)
    proc = run_here(isolated(snippet.args, tmp_path), tmp_path, build=False)
    assert proc.returncode == 0, f"{snippet}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    if snippet.args[:2] == ("cache", "clean") and "--yes" in snippet.args:
        assert not (tmp_path / "outputs" / snippet.args[2]).exists()  # and it did remove them


def _recipe_fragments() -> list[tuple[str, dict[str, object]]]:
    """The YAML blocks of docs/ that are recipe fragments (they set ``model``)."""
    out = []
    for doc in DOCS[1:]:
        for lang, body, start in _blocks(doc.read_text(encoding="utf-8")):
            data = yaml.safe_load(body) if lang == "yaml" else None
            if isinstance(data, dict) and "model" in data:
                out.append((f"{doc.name}:{start}", data))
    return out


def test_every_recipe_fragment_in_docs_names_declared_fields_only() -> None:
    """docs/ show recipe fragments (the README's whole recipes are built by test_readme.py):
    each key is a declared field, or a section of them, or the model's own arguments."""
    from hyperexport.product.config.fields import leaves
    from hyperexport.product.config.schema import RecipeConfig

    declared = {path for path, _ in leaves(RecipeConfig)}
    sections = {p.rpartition(".")[0] for p in declared if "." in p}
    fragments = _recipe_fragments()
    assert len(fragments) >= 3
    for where, data in fragments:
        for key, value in data.items():
            assert key in declared or key in sections, f"{where}: {key!r} is no recipe field"
            if key in sections and isinstance(value, dict):
                for sub in value:
                    assert f"{key}.{sub}" in declared or f"{key}.{sub}" in sections, (
                        f"{where}: {key}.{sub} is no recipe field"
                    )

"""The hyperexport code each stage's key covers, computed from the import graph."""

from __future__ import annotations

import json
from pathlib import Path

from hyperexport.engine import code_closure
from hyperexport.engine.code_closure import (
    ImportMemo,
    closure,
    package_sources,
    read_package,
    stage_code,
)


def _files(stage: str) -> set[str]:
    return {p.removeprefix("hyperexport/") for p in stage_code(f"hyperexport.stages.{stage}")}


def _under(files: set[str], *folders: str) -> set[str]:
    return {f for f in files if f.startswith(folders)}


def test_check_runs_check_and_contracts_only() -> None:
    files = _files("check")
    # The judge, and the evaluator it loads (inside a function) to localise a failure.
    assert {"check/report.py", "check/judge.py", "check/model_evaluator.py"} <= files
    assert "contracts/capture_files.py" in files
    assert not _under(files, "capture/", "export/", "passes/", "transformers/", "api.py")
    assert "stages/trace.py" not in files  # stages/__init__ loads no sibling stage


def test_evaluate_runs_the_evaluator_not_the_judge() -> None:
    files = _files("evaluate")
    assert {"check/model_evaluator.py", "check/function_runs.py", "check/evaluation.py"} <= files
    assert "check/judge.py" not in files  # a judging change reruns check, not evaluate
    assert not _under(files, "capture/", "export/", "passes/", "transformers/", "api.py")


def test_rewrite_runs_the_passes_not_the_exporter_or_the_check() -> None:
    files = _files("rewrite")
    assert {"passes/pipeline.py", "passes/promote_attention.py", "model_file.py"} <= files
    assert not _under(files, "capture/", "export/", "check/", "api.py")


def test_export_and_trace_do_not_run_passes_or_check() -> None:
    export, trace = _files("export"), _files("trace")
    assert {"export/units.py", "export/fallback.py", "capture/hooks.py"} <= export
    assert "capture/hooks.py" in trace
    for files in (export, trace):
        assert not _under(files, "passes/", "check/")
    assert not _under(trace, "export/")


def test_digests_follow_file_contents() -> None:
    sources = package_sources()
    files = stage_code("hyperexport.stages.check")
    assert files["hyperexport/check/report.py"] == sources["hyperexport.check.report"].digest


def _package(root: Path, files: dict[str, str]) -> dict[str, object]:
    for rel, text in files.items():
        path = root / "hyperexport" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dict(read_package(root / "hyperexport"))


def test_used_and_loaded_modules(tmp_path: Path) -> None:
    """Function-level imports of used modules count; a loaded module's do not; TYPE_CHECKING
    imports never run; ``from pkg import submodule`` only loads ``pkg``."""
    sources = _package(
        tmp_path,
        {
            "__init__.py": "def __getattr__(n):\n    from hyperexport import heavy\n",
            "heavy.py": "",
            "stages/__init__.py": "from hyperexport.stages import a, b\n",
            "stages/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from hyperexport import typed_only\n"
                "def run():\n    from .helper import f\n"
            ),
            "stages/b.py": "def run():\n    import hyperexport.other\n",
            "stages/helper.py": "from hyperexport import util\n",
            "util.py": "",
            "other.py": "",
            "typed_only.py": "",
        },
    )
    found = closure(["hyperexport.stages.a"], sources)  # type: ignore[arg-type]
    assert sorted(found) == [
        "hyperexport/__init__.py",
        "hyperexport/stages/__init__.py",
        "hyperexport/stages/a.py",
        "hyperexport/stages/b.py",
        "hyperexport/stages/helper.py",
        "hyperexport/util.py",
    ]


def test_import_memo_skips_parsing_known_files(tmp_path: Path) -> None:
    memo = ImportMemo(tmp_path / "imports.json")
    parsed = read_package(code_closure.PACKAGE_DIR, memo)
    memo.save()
    again = ImportMemo(tmp_path / "imports.json")
    with_memo = read_package(code_closure.PACKAGE_DIR, again)
    assert with_memo == parsed
    assert not again._dirty  # every file was known: nothing parsed


def test_malformed_memo_entries_are_parsed_again(tmp_path: Path) -> None:
    memo = ImportMemo(tmp_path / "imports.json")
    read_package(code_closure.PACKAGE_DIR, memo)
    memo.save()
    data = json.loads((tmp_path / "imports.json").read_text())
    key = next(k for k in data if k.startswith("hyperexport.stages.check:"))
    data[key] = [[["x", [1]]], "garbage"]
    (tmp_path / "imports.json").write_text(json.dumps(data))
    again = read_package(code_closure.PACKAGE_DIR, ImportMemo(tmp_path / "imports.json"))
    assert again == read_package(code_closure.PACKAGE_DIR)


def test_a_comment_changes_no_digest_but_code_and_docstrings_do() -> None:
    """Issue 24: a comment added to hyperexport/errors.py reran all five stages."""
    from hyperexport.engine.code_closure import token_digest

    base = b'"""Doc."""\n\ndef f(x):\n    return x + 1\n'
    same = [
        b'"""Doc."""\n\n# a note\ndef f(x):  # why\n    return x + 1\n',
        b'"""Doc."""\n\n\n\ndef f(x):\n    return x+1\n',
    ]
    other = [
        b'"""Doc!"""\n\ndef f(x):\n    return x + 1\n',  # code can read a docstring
        b'"""Doc."""\n\ndef f(x):\n    return x + 2\n',
        b'"""Doc."""\n\ndef f(x):\n    return "# x + 1"\n',  # a '#' inside a string is code
    ]
    assert all(token_digest(s) == token_digest(base) for s in same)
    assert all(token_digest(s) != token_digest(base) for s in other)


def test_a_comment_in_a_package_module_changes_no_stage_code(tmp_path: Path) -> None:
    root = tmp_path / "hyperexport"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "errors.py").write_text("class E(Exception):\n    pass\n")
    before = closure(["hyperexport.errors"], read_package(root))
    (root / "errors.py").write_text("# why E exists\nclass E(Exception):\n    pass  # nothing\n")
    assert closure(["hyperexport.errors"], read_package(root)) == before
    (root / "errors.py").write_text("class E(ValueError):\n    pass\n")
    assert closure(["hyperexport.errors"], read_package(root)) != before

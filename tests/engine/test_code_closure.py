"""The code a stage's key covers, computed from the import graph of a package's sources (a toy
package: the engine keys whatever package it is handed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyperexport.engine import code_closure
from hyperexport.engine.code_closure import (
    IMPORT_MEMO,
    CodePackage,
    ImportMemo,
    closure,
    package_sources,
    read_package,
    stage_code,
    token_digest,
)
from hyperexport.engine.keyed_imports import keyed_imports
from hyperexport.engine.runner import BuildRequest, Runner
from tests.engine.fakes import CONFIG, ENV, MODEL, open_store, pipeline

#: The toy package's name.
PKG = "toypkg"


def _package(root: Path, files: dict[str, str]) -> dict[str, object]:
    for rel, text in files.items():
        path = root / PKG / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dict(read_package(root / PKG))


def _toy(root: Path) -> CodePackage:
    """A package of a few modules that import each other."""
    _package(
        root,
        {
            "__init__.py": "",
            "stages/__init__.py": "",
            "stages/check.py": "from toypkg import report\ndef run():\n    from toypkg import judge\n",
            "report.py": "X = 1\n",
            "judge.py": "from toypkg.report import X\n",
        },
    )
    return CodePackage(PKG, root / PKG)


def test_digests_follow_file_contents_and_the_package_is_the_one_handed(tmp_path: Path) -> None:
    package = _toy(tmp_path)
    sources = package_sources(package)
    files = stage_code("toypkg.stages.check", (), sources)
    assert sorted(files) == [
        "toypkg/__init__.py",
        "toypkg/judge.py",
        "toypkg/report.py",
        "toypkg/stages/__init__.py",
        "toypkg/stages/check.py",
    ]
    assert files["toypkg/report.py"] == sources["toypkg.report"].digest
    assert stage_code("toypkg.stages.check", (), {}) == {}  # no package handed: no code keyed


def test_used_and_loaded_modules(tmp_path: Path) -> None:
    """Function-level imports of used modules count; a loaded module's do not; TYPE_CHECKING
    imports never run; ``from pkg import submodule`` only loads ``pkg``."""
    sources = _package(
        tmp_path,
        {
            "__init__.py": "def __getattr__(n):\n    from toypkg import heavy\n",
            "heavy.py": "",
            "stages/__init__.py": "from toypkg.stages import a, b\n",
            "stages/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from toypkg import typed_only\n"
                "def run():\n    from .helper import f\n"
            ),
            "stages/b.py": "def run():\n    import toypkg.other\n",
            "stages/helper.py": "from toypkg import util\n",
            "util.py": "",
            "other.py": "",
            "typed_only.py": "",
        },
    )
    found = closure(["toypkg.stages.a"], sources)  # type: ignore[arg-type]
    assert sorted(found) == [
        "toypkg/__init__.py",
        "toypkg/stages/__init__.py",
        "toypkg/stages/a.py",
        "toypkg/stages/b.py",
        "toypkg/stages/helper.py",
        "toypkg/util.py",
    ]


def test_import_memo_skips_parsing_known_files(tmp_path: Path) -> None:
    root = _toy(tmp_path / "src").root
    memo = ImportMemo(tmp_path / "imports.json")
    parsed = read_package(root, memo)
    memo.save()
    again = ImportMemo(tmp_path / "imports.json")
    with_memo = read_package(root, again)
    assert with_memo == parsed
    assert not again._dirty  # every file was known: nothing parsed


def test_malformed_memo_entries_are_parsed_again(tmp_path: Path) -> None:
    root = _toy(tmp_path / "src").root
    memo = ImportMemo(tmp_path / "imports.json")
    read_package(root, memo)
    memo.save()
    data = json.loads((tmp_path / "imports.json").read_text())
    key = next(k for k in data if k.startswith("toypkg.stages.check:"))
    data[key] = [[["x", [1]]], "garbage"]
    (tmp_path / "imports.json").write_text(json.dumps(data))
    again = read_package(root, ImportMemo(tmp_path / "imports.json"))
    assert again == read_package(root)


def test_a_comment_changes_no_digest_but_code_and_docstrings_do() -> None:
    """Issue 24: a comment added to a module of the package reran every stage."""
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
    root = tmp_path / "toypkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "errors.py").write_text("class E(Exception):\n    pass\n")
    before = closure(["toypkg.errors"], read_package(root))
    (root / "errors.py").write_text("# why E exists\nclass E(Exception):\n    pass  # nothing\n")
    assert closure(["toypkg.errors"], read_package(root)) == before
    (root / "errors.py").write_text("class E(ValueError):\n    pass\n")
    assert closure(["toypkg.errors"], read_package(root)) != before


def test_an_outer_keyed_loader_keeps_one_import_memo_for_every_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's keyed loader (one folder per user) holds the parsed imports, so a build
    into a new cache parses nothing its user's earlier builds parsed; the cache's own index
    holds no memo then."""
    package = _toy(tmp_path / "src")
    parsed: list[str] = []
    real_parse = code_closure._parse

    def counting_parse(data: bytes, path: Path, name: str) -> Any:
        parsed.append(name)
        return real_parse(data, path, name)

    monkeypatch.setattr(code_closure, "_parse", counting_parse)
    outer = tmp_path / "user" / "bytecode"
    with keyed_imports(outer):
        for cache in ("one", "two"):
            monkeypatch.setattr(code_closure, "_READ", {})  # a new process
            fresh = len(parsed)
            store = open_store(tmp_path / cache)
            request = BuildRequest(
                name="fake", config=CONFIG, source="f.json", stages=pipeline(), env=ENV, model=MODEL
            )
            Runner(store, lambda: "model", package=package).run(request)
            assert not (tmp_path / cache / "index" / "imports.json").exists()
            if cache == "one":
                assert len(parsed) - fresh == 5  # every module of the toy package, once
            else:
                assert len(parsed) == fresh  # the second cache parsed nothing
    memo = json.loads((outer / IMPORT_MEMO).read_text())
    assert sorted(k.partition(":")[0] for k in memo) == sorted(
        ["toypkg", "toypkg.stages", "toypkg.stages.check", "toypkg.report", "toypkg.judge"]
    )


def test_a_shared_memo_is_bounded_and_keeps_what_this_process_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(code_closure, "SHARED_MEMO_ENTRIES", 2)
    path = tmp_path / IMPORT_MEMO
    earlier = ImportMemo(path)  # other versions' entries, written before
    for name in ("a", "b", "c"):
        earlier.put(f"{name}:0", ([], []), "t")
    earlier.save()
    shared = ImportMemo(path, bounded=True)
    assert shared.get("b:0") is not None
    shared.put("d:0", ([], []), "t")
    shared.save()
    assert set(json.loads(path.read_text())) == {"b:0", "d:0"}  # the bound holds; used ones stay
    assert ImportMemo(path, bounded=True).get("b:0") is not None  # and still read back

"""The code a stage's key covers, computed from the import graph of a package's sources (a toy
package: the engine keys whatever package it is handed)."""

from __future__ import annotations

import json
from pathlib import Path

from hyperexport.engine.code_closure import (
    CodePackage,
    ImportMemo,
    closure,
    package_sources,
    read_package,
    stage_code,
    token_digest,
)

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

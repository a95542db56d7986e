"""A set of allowed values, or a file name, is written in one module of the package; the others
import it (read with ``ast``, nothing is imported).

* value sets: a module-level tuple, list, set or frozenset of two or more literals, and every
  ``Literal[...]`` of two or more values, anywhere;
* file names: a string literal shaped like a file name (``auto.json``, ``model.onnx``), at
  module level or in code (docstrings, comments and f-string text are prose, not counted).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import hyperexport

PACKAGE = Path(hyperexport.__file__).parent
FILE_NAME = re.compile(r"[\w-]+\.(json|npz|onnx|data|txt|html|yaml|lock|tmp)")
#: Names that look like files but are someone else's, spelled as their owner spells them.
NOT_OURS = {
    "ai.onnx",  # ONNX's default domain, named by its spec
}


def _literals(node: ast.expr) -> frozenset[str] | None:
    """The values of a tuple, list or set display of two or more literals, else None."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("frozenset", "set", "tuple"):
        node = node.args[0] if node.args else node
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
    if len(elts) < 2 or not all(isinstance(e, ast.Constant) for e in elts):
        return None
    return frozenset(ast.unparse(e) for e in elts)


def _value_sets(tree: ast.Module) -> Iterator[frozenset[str]]:
    for node in tree.body:
        values = None
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            values = _literals(node.value)
        if values:
            yield values
    for node in ast.walk(tree):
        values = None
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal":
            values = _literals(node.slice)
        if values:
            yield values


def _prose(tree: ast.Module) -> set[int]:
    """ids of docstring and f-string constants."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
        elif isinstance(node, ast.JoinedStr):
            found.update(id(v) for v in node.values)
    return found


def _file_names(tree: ast.Module) -> Iterator[str]:
    prose = _prose(tree)
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) and id(node) not in prose else None
        if isinstance(text, str) and FILE_NAME.fullmatch(text) and text not in NOT_OURS:
            yield text


def written_twice(sources: dict[str, str]) -> dict[str, list[str]]:
    """``{value set or file name: modules}`` for each one written in more than one module."""
    seen: dict[str, set[str]] = defaultdict(set)
    for module, text in sources.items():
        tree = ast.parse(text)
        for values in _value_sets(tree):
            seen[", ".join(sorted(values))].add(module)
        for name in _file_names(tree):
            seen[name].add(module)
    return {what: sorted(where) for what, where in sorted(seen.items()) if len(where) > 1}


def test_the_finder_finds_each_kind() -> None:
    a = 'X = ("all", "none")\nF = "auto.json"\n'
    b = (
        '"""Writes auto.json."""\nfrom typing import Literal\n'
        'M = Literal["none", "all"]\ndef f(d):\n    return d / "auto.json"\n'
    )
    c = 'def g(d):\n    return f"{d}/auto.json"\nY = ("all", "some")\n'
    assert written_twice({"a": a, "b": b, "c": c}) == {
        "'all', 'none'": ["a", "b"],
        "auto.json": ["a", "b"],
    }


def test_no_value_set_or_file_name_is_written_in_two_modules() -> None:
    sources = {
        p.relative_to(PACKAGE.parent).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    assert written_twice(sources) == {}

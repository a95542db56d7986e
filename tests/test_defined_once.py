"""A set of allowed values, or a file name, is written in one module of the package; the others
import it (read with ``ast``, nothing is imported).

* value sets: a module-level tuple, list, set or frozenset of two or more literals, and every
  ``Literal[...]`` of two or more values, anywhere;
* subsets: a value set of strings written in one module whose values all belong to a value set
  of another module (``("trace", "export")`` beside the stage names): a copy of part of it;
* literals compared in code: a string compared (``==``, ``!=``, ``in``) inside any function
  that is a value of a set written in another module (``mode == "per_type"`` beside the
  function modes): that module's name for it is imported instead;
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
#: Strings compared in code that belong to other libraries' vocabularies, spelled as they do:
#: numpy's and ONNX's dtype names (a recipe's ``dtype`` choices are these names too), Hydra's
#: ``_target_`` key, transformers' argument names, ONNX's op types and attributes and ONNX
#: Runtime's kernel inputs.
OTHERS_VOCABULARY = {
    *("", "bool", "bfloat16", "float16", "float32", "_target_", "cache_position"),
    *("Add", "Cast", "Identity", "Mul", "ReduceMean", "Sqrt", "Where"),  # ONNX op types
    *("key", "value", "q_num_heads", "kv_num_heads"),  # ONNX Runtime's inputs, ONNX's attributes
}


def _literals(node: ast.expr) -> frozenset[str] | None:
    """The values of a tuple, list or set display of two or more literals, else None."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("frozenset", "set", "tuple"):
        node = node.args[0] if node.args else node
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
    if len(elts) < 2 or not all(isinstance(e, ast.Constant) for e in elts):
        return None
    return frozenset(ast.unparse(e) for e in elts)


def _strings(values: frozenset[str]) -> frozenset[str]:
    """The string values of a value set (as :func:`_literals` spells them)."""
    return frozenset(v for v in values if v[:1] in ("'", '"'))


def _compared(tree: ast.Module) -> Iterator[tuple[int, frozenset[str]]]:
    """``(line, strings)`` of every comparison inside a function with string literals: a
    compared constant, or the literals of an ``in (...)`` display."""
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Compare):
                continue
            found: set[str] = set()
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and isinstance(side.value, str):
                    found.add(ast.unparse(side))
                found |= _strings(_literals(side) or frozenset())
            if found:
                yield node.lineno, frozenset(found)


def _exports(node: ast.stmt) -> bool:
    """``__all__ = [...]``: what a module exports, by name, not a value set (a public home
    repeats its library module's, ``tests/library/test_public_homes.py``)."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return any(getattr(t, "id", "") == "__all__" for t in targets)


def _value_sets(tree: ast.Module) -> Iterator[frozenset[str]]:
    for node in tree.body:
        values = None
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            if _exports(node):
                continue
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


def copied_values(sources: dict[str, str]) -> list[str]:
    """Subsets of another module's value set, and literals compared in code that another
    module names: one line each."""
    sets: dict[str, list[frozenset[str]]] = {
        module: [s for s in (_strings(v) for v in _value_sets(ast.parse(text))) if s]
        for module, text in sources.items()
    }
    found = []
    for module, text in sources.items():
        for values in sets[module]:
            owners = [m for m, vs in sets.items() if m != module and any(values < w for w in vs)]
            ours = {v for v in values if v not in {repr(w) for w in OTHERS_VOCABULARY}}
            if len(values) > 1 and owners and ours:
                found.append(f"{module}: {', '.join(sorted(values))} is a subset of {owners[0]}'s")
        for line, strings in _compared(ast.parse(text)):
            for value in sorted(strings - {repr(v) for v in OTHERS_VOCABULARY}):
                owners = [
                    m for m, vs in sets.items() if m != module and any(value in w for w in vs)
                ]
                if owners:
                    found.append(f"{module}:{line}: {value} compared; {owners[0]} names it")
    return found


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


def test_the_copy_finder_finds_subsets_and_compared_literals() -> None:
    a = 'MODES = ("per_instance", "per_type")\nSTAGES = ("trace", "export", "check")\n'
    b = (
        'MODEL = ("trace", "export")\n'
        'def f(mode, dtype):\n    return mode == "per_type" or dtype == "float32"\n'
        'def g(stage):\n    return stage in ("check", "other")\n'
    )
    assert copied_values({"a": a, "b": b}) == [
        "b: 'export', 'trace' is a subset of a's",
        "b:3: 'per_type' compared; a names it",
        "b:5: 'check' compared; a names it",
    ]


def test_no_value_set_is_copied_in_part_and_no_named_value_is_compared_as_a_literal() -> None:
    sources = {
        p.relative_to(PACKAGE.parent).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(PACKAGE.rglob("*.py"))
    }
    assert copied_values(sources) == []

"""The engine speaks its own words and stands on its own: its source names nothing of the
product, imports nothing but itself, the standard library and its two dependencies, and its
tests import nothing but the engine (they also run with the engine alone: ``test_alone.py``).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import hyperexport.engine as engine

ENGINE = Path(engine.__file__).parent
TESTS = Path(__file__).parent
#: Words the engine's source (code, strings, docstrings, comments) never holds, in any case.
PRODUCT_WORDS = re.compile("hyperexport|recipe|onnx|torch", re.IGNORECASE)
#: What the engine may import besides itself and the standard library.
DEPENDENCIES = {"filelock", "fsspec"}
#: What the engine's tests may import besides the engine, themselves and the standard library.
TEST_TOOLS = {"pytest", "filelock", "fsspec", "boto3"}


def product_words(source: bytes) -> list[tuple[int, str]]:
    """``(line, token)`` of every token of ``source`` that holds a product word."""
    tokens = tokenize.tokenize(io.BytesIO(source).readline)
    return [(t.start[0], t.string) for t in tokens if PRODUCT_WORDS.search(t.string)]


def outside_imports(source: str, own: str) -> set[str]:
    """Top-level modules ``source`` imports (at any level) that are neither relative, nor
    ``own``, nor the standard library."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    return found - {own, "__future__"} - set(sys.stdlib_module_names)


def test_the_finders_find_a_word_and_an_import() -> None:
    assert product_words(b'"""Runs the ONNX model."""\nx = 1  # fine\n') == [
        (1, '"""Runs the ONNX model."""')
    ]
    assert product_words(b"def f(recipe_file):\n    pass\n") == [(1, "recipe_file")]
    assert outside_imports("import os\nfrom . import a\nimport numpy.linalg\n", "x") == {"numpy"}


def test_the_engine_source_names_nothing_of_the_product() -> None:
    found = {
        p.name: words
        for p in sorted(ENGINE.glob("*.py"))
        if (words := product_words(p.read_bytes()))
    }
    assert found == {}


def test_the_engine_imports_only_itself_the_standard_library_and_its_dependencies() -> None:
    own = engine.__name__.partition(".")[0]
    found = {
        p.name: sorted(outside)
        for p in sorted(ENGINE.glob("*.py"))
        if (outside := outside_imports(p.read_text(encoding="utf-8"), own) - DEPENDENCIES)
    }
    assert found == {}


def test_the_engine_tests_import_only_the_engine() -> None:
    own = engine.__name__.partition(".")[0]
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        outside = outside_imports(source, own) - TEST_TOOLS - {"tests"}
        product = [
            m
            for m in re.findall(rf"\b{own}(?:\.\w+)+", source)
            if not m.startswith(engine.__name__)
        ]
        if outside or product:
            found[path.name] = sorted(outside | set(product))
    assert found == {}

"""The engine's tests run on fake stages alone: they import nothing of the product."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the engine itself may import (docs/ARCHITECTURE.md: the engine, and the base floor).
ALLOWED = ("hyperexport.engine", "hyperexport.errors", "hyperexport.atomic", "hyperexport.files")


def _runtime_imports(path: Path) -> list[str]:
    """Modules ``path`` imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _product_imports(path: Path, seen: set[Path]) -> list[str]:
    """Product modules imported by ``path``, or by the test helpers it imports (recursively)."""
    if path in seen:
        return []
    seen.add(path)
    bad: list[str] = []
    for name in _runtime_imports(path):
        if name.startswith("tests."):
            helper = ROOT / (name.replace(".", "/") + ".py")
            if helper.is_file():
                bad += _product_imports(helper, seen)
        elif name.startswith("hyperexport") and not name.startswith(ALLOWED):
            bad.append(f"{path.relative_to(ROOT)}: {name}")
    return bad


def test_the_engine_tests_and_their_fakes_import_no_product_code() -> None:
    seen: set[Path] = set()
    files = sorted((ROOT / "tests" / "engine").glob("*.py"))
    assert files
    bad = [b for f in files for b in _product_imports(f, seen)]
    assert ROOT / "tests" / "helpers" / "fake_stages.py" in seen
    assert bad == []


def test_the_check_finds_a_product_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hyperexport.config\n"
        "def f():\n    from hyperexport.config import Recipe\n"
    )
    assert _runtime_imports(module) == ["typing", "hyperexport.config"]

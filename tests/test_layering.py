"""The package's import graph, read from the sources with ``ast`` (nothing is imported).

(a) No two files import each other, directly or around a longer loop, at module level, nor
    through imports inside functions (a cycle held apart by a lazy import is still a cycle).
(b) ``passes/``, ``check/`` and ``contracts/`` import no torch at module level, not even through
    another hyperexport module they import at module level.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import hyperexport

PACKAGE = Path(hyperexport.__file__).parent
TORCH_FREE = ("hyperexport.passes", "hyperexport.check", "hyperexport.contracts")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imported(node: ast.Import | ast.ImportFrom, module: str) -> Iterator[str]:
    """Names of the modules an import statement loads (``from a import b`` may load a.b)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    yield base
    yield from (f"{base}.{alias.name}" for alias in node.names)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level_imports(module: str) -> set[str]:
    """What ``module`` imports when it is loaded: top-level statements, outside functions and
    classes' methods and outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(node, module))
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *node.orelse, *node.finalbody]
            pending += [s for h in node.handlers for s in h.body]
        elif isinstance(node, (ast.With, ast.ClassDef)):
            pending += node.body
    return found


def _all_imports(module: str) -> set[str]:
    """Every import in ``module``, module level and inside functions."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(_imported(node, module))
    return found


def _edges(imports: set[str], module: str) -> set[str]:
    """The hyperexport files among ``imports`` (a package import loads its ``__init__``).

    Importing ``a.b.c`` loads ``a``, ``a.b`` and ``a.b.c``; the packages that contain ``module``
    itself are loaded already when it runs, so they are not edges of it.
    """
    ancestors = {".".join(module.split(".")[:end]) for end in range(1, module.count(".") + 1)}
    targets: set[str] = set()
    for name in imports:
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            prefix = ".".join(parts[:end])
            if prefix in MODULES and prefix != module and prefix not in ancestors:
                targets.add(prefix)
    return targets


GRAPH = {m: _edges(_module_level_imports(m), m) for m in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop between files, if any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_parser_sees_imports_at_both_levels() -> None:
    """The walk is only as good as what it sees: a known module-level and a known lazy import."""
    assert "hyperexport.export.units" in GRAPH["hyperexport.export.fallback"]
    lazy = "hyperexport.export.fallback"  # imported inside ExportStage.run
    assert lazy in _edges(_all_imports("hyperexport.stages.export"), "x")
    assert lazy not in GRAPH["hyperexport.stages.export"]


def test_the_cycle_finder_finds_a_loop() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_files_at_module_level() -> None:
    assert _cycle(GRAPH) is None


def test_no_import_cycle_between_files_even_through_lazy_imports() -> None:
    everything = {m: _edges(_all_imports(m), m) for m in MODULES}
    assert _cycle(everything) is None


def _loads_torch(module: str, seen: set[str]) -> list[str] | None:
    """The chain of module-level imports from ``module`` to torch, if there is one."""
    if module in seen:
        return None
    seen.add(module)
    imports = _module_level_imports(module)
    if any(name == "torch" or name.startswith("torch.") for name in imports):
        return [module, "torch"]
    for target in sorted(GRAPH[module]):
        chain = _loads_torch(target, seen)
        if chain:
            return [module, *chain]
    return None


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_packages_import_no_torch_at_module_level(package: str) -> None:
    offenders = {
        m: chain
        for m in MODULES
        if m == package or m.startswith(f"{package}.")
        if (chain := _loads_torch(m, set()))
    }
    assert offenders == {}

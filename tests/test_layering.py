"""The package's import graph, read with the parser the build keys use
(:mod:`hyperexport.engine.code_closure`: ``ast``, nothing is imported).

(a) The layer table of ``docs/ARCHITECTURE.md`` holds: a module imports only modules of its own
    row or of rows below it, at module level or inside a function; the engine (the lowest row)
    never imports the library; every module has a row; a side that has its folder
    (``SIDE_FOLDERS``) holds every module of its rows, and nothing else.
(b) ``versions.py`` (the version bridge, the lowest floor above the engine) imports only the standard library, torch,
    transformers and the ONNX libraries.
(c) No two files import each other, directly or around a longer loop, at module level, nor
    through imports inside functions (a cycle held apart by a lazy import is still a cycle).
(d) ``library/passes/``, ``library/check/`` and ``base/contracts/`` import no torch at module level, not even through
    another hyperexport module they import at module level.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

import hyperexport
from hyperexport.engine.code_closure import Import, ModuleSource, _imports, read_package

PACKAGE = Path(hyperexport.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
TORCH_FREE = (
    "hyperexport.library.passes",
    "hyperexport.library.check",
    "hyperexport.base.contracts",
)
#: Sides that never import each other, whatever their rows (importer, imported).
APART = {("engine", "library")}
#: The engine stands alone at the bottom of the table (it imports nothing of the package).
ENGINE = "hyperexport.engine"
#: The sides whose modules sit in a folder of their own (``__main__`` is the command line's
#: entry, beside the public names).
SIDE_FOLDERS = {
    "product": "hyperexport.product",
    "engine": ENGINE,
    "library": "hyperexport.library",
    "base": "hyperexport.base",
}
SIDE_FOLDER_EXCEPTIONS = {"hyperexport.__main__"}
#: The public homes' side: thin modules outside every folder that re-export the library (and,
#: deprecated, the base), so that the import paths users, recipes and published models name
#: keep resolving (``tests/library/test_public_homes.py``).
PUBLIC = "public"
#: Table names that stand for their ``__init__`` only: the package's and the library folder's
#: (as prefixes they would hold every module under them, and hide a module no row names).
EXACT_NAMES = {"hyperexport", "hyperexport.library"}
#: What the version bridge may import besides the standard library.
VERSION_BRIDGE = "hyperexport.base.versions"
VERSION_BRIDGE_MAY_IMPORT = {
    "packaging",  # version parsing only (a dependency of torch's and onnx's own tools)
    "torch",
    "transformers",
    "onnx",
    "onnxscript",
    "onnx_ir",
    "onnxruntime",
}

SOURCES: dict[str, ModuleSource] = read_package(PACKAGE)


@dataclass(frozen=True)
class Row:
    """One row of the layer table: its position (0 = top), side and the names in its first cell."""

    floor: int
    side: str
    names: tuple[str, ...]


def _module_of(cell_name: str) -> str:
    """``cli/`` -> ``hyperexport.product.cli``; ``api.py`` -> ``hyperexport.library.api``;
    ``__init__.py`` -> ``hyperexport``."""
    name = cell_name.removesuffix("/").removesuffix(".py")
    return "hyperexport" if name == "__init__" else f"hyperexport.{name.replace('/', '.')}"


def read_layers(text: str) -> list[Row]:
    """The rows of the first Markdown table whose header starts ``| package |`` and has a
    ``side`` column, top to bottom."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.startswith("| package |") and "| side |" in line
    )
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    side_at = header.index("side")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = tuple(_module_of(n) for n in re.findall(r"`([^`]+)`", cells[0]))
        rows.append(Row(len(rows), cells[side_at], names))
    return rows


LAYERS = read_layers(ARCHITECTURE.read_text(encoding="utf-8"))


def row_of(module: str, layers: list[Row] = LAYERS) -> Row | None:
    """The row of the longest table name that is ``module`` or a package containing it."""
    best: tuple[int, Row] | None = None
    for row in layers:
        for name in row.names:
            inside = module == name or (name not in EXACT_NAMES and module.startswith(f"{name}."))
            if inside and (best is None or len(name) > best[0]):
                best = (len(name), row)
    return best[1] if best else None


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:end]) for end in range(1, len(parts))}


def edges(statements: Iterable[Import], module: str, sources: dict[str, ModuleSource]) -> set[str]:
    """The package files that ``statements`` load: each module named and the packages above it
    (``from pkg import submodule`` loads the submodule, ``from pkg import name`` the package);
    the packages containing ``module`` are loaded before it runs, so they are not edges of it."""
    targets: set[str] = set()
    for base, names in statements:
        named = {f"{base}.{n}" for n in names if f"{base}.{n}" in sources}
        if len(named) < len(names) or not names:
            named.add(base)
        for target in named:
            targets.update(t for t in {target, *_ancestors(target)} if t in sources)
    return targets - {module} - _ancestors(module)


GRAPH = {m: edges(s.module_level, m, SOURCES) for m, s in SOURCES.items()}
EVERYTHING = {
    m: edges((*s.module_level, *s.function_level), m, SOURCES) for m, s in SOURCES.items()
}


def wrong_imports(graph: dict[str, set[str]], layers: list[Row]) -> list[tuple[str, str, str]]:
    """``(importer, imported, why)`` for each import the layer table forbids."""
    found = []
    for module, targets in sorted(graph.items()):
        here = row_of(module, layers)
        for target in sorted(targets):
            there = row_of(target, layers)
            if here is None or there is None:
                continue  # reported by test_every_module_has_a_row
            if there.floor < here.floor:
                found.append((module, target, "upward"))
            elif (here.side, there.side) in APART:
                found.append((module, target, f"{here.side} -> {there.side}"))
    return found


def test_the_layer_table_is_read() -> None:
    """The table parses into rows with known sides, the engine and the library apart."""
    by_module = {name: row for row in LAYERS for name in row.names}
    assert by_module["hyperexport.product.cli"].floor == 0
    assert by_module["hyperexport.engine"].side == "engine"
    assert by_module["hyperexport.library.check"].side == "library"
    assert by_module["hyperexport.library.export"].side == "library"
    assert by_module[ENGINE].floor == len(LAYERS) - 1
    assert by_module[VERSION_BRIDGE].floor == len(LAYERS) - 2
    assert {row.side for row in LAYERS} <= {*SIDE_FOLDERS, PUBLIC}


def test_the_parser_sees_imports_at_both_levels() -> None:
    """The walk is only as good as what it sees: a known module-level and a known lazy import."""
    assert "hyperexport.library.export.units" in GRAPH["hyperexport.library.export.fallback"]
    lazy = "hyperexport.library.export.fallback"  # imported inside ExportStage.run
    assert lazy in EVERYTHING["hyperexport.product.stages.export"]
    assert lazy not in GRAPH["hyperexport.product.stages.export"]


def test_an_upward_or_crossing_import_is_found() -> None:
    """The rule itself, on a made-up table: an upward lazy import and an engine -> library import."""
    layers = [
        Row(0, "product", ("hyperexport.product.cli",)),
        Row(1, "engine", ("hyperexport.engine",)),
        Row(2, "library", ("hyperexport.library.check",)),
        Row(3, "base", ("hyperexport.base.errors",)),
    ]
    tree = ast.parse(
        "import hyperexport.base.errors\ndef f():\n    from hyperexport.product.cli import build\n"
    )
    sources = {
        name: ModuleSource(name, "", "", (), ())
        for name in (
            "hyperexport.product.cli",
            "hyperexport.product.cli.build",
            "hyperexport.base.errors",
        )
    }
    module_level, function_level = _imports(tree, "hyperexport.library.check.x", False)
    graph = {
        "hyperexport.library.check.x": edges(
            (*module_level, *function_level), "hyperexport.library.check.x", sources
        ),
        "hyperexport.engine.y": {"hyperexport.library.check.x"},
        "hyperexport.product.cli.build": {"hyperexport.engine.y", "hyperexport.library.check.x"},
    }
    assert wrong_imports(graph, layers) == [
        ("hyperexport.engine.y", "hyperexport.library.check.x", "engine -> library"),
        ("hyperexport.library.check.x", "hyperexport.product.cli", "upward"),
        ("hyperexport.library.check.x", "hyperexport.product.cli.build", "upward"),
    ]


def test_a_side_with_a_folder_holds_its_rows_and_only_them() -> None:
    """Every side has its folder; the public homes sit outside all of them."""
    assert set(SIDE_FOLDERS) == {row.side for row in LAYERS} - {PUBLIC}
    misplaced = []
    for module in SOURCES:
        row = row_of(module)
        if row is None or module in SIDE_FOLDER_EXCEPTIONS:
            continue
        for side, folder in SIDE_FOLDERS.items():
            inside = module == folder or module.startswith(f"{folder}.")
            if inside != (row.side == side):
                misplaced.append((module, row.side))
    assert misplaced == []


def test_every_module_has_a_row() -> None:
    assert [m for m in SOURCES if row_of(m) is None] == []


def test_no_import_goes_up_the_layer_table_or_across_engine_and_library() -> None:
    """Module level and inside functions: a lazy import is still an import."""
    assert wrong_imports(EVERYTHING, LAYERS) == []


def test_the_version_bridge_imports_only_torch_transformers_and_onnx() -> None:
    source = SOURCES.get(VERSION_BRIDGE)
    if source is None:
        pytest.skip("hyperexport/base/versions.py does not exist yet")
    tops = {base.split(".")[0] for base, _ in (*source.module_level, *source.function_level)}
    outside = tops - set(sys.stdlib_module_names) - VERSION_BRIDGE_MAY_IMPORT - {"__future__"}
    assert outside == set()


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


def test_the_cycle_finder_finds_a_loop() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_files_at_module_level() -> None:
    assert _cycle(GRAPH) is None


def test_no_import_cycle_between_files_even_through_lazy_imports() -> None:
    assert _cycle(EVERYTHING) is None


def _loads_torch(module: str, seen: set[str]) -> list[str] | None:
    """The chain of module-level imports from ``module`` to torch, if there is one."""
    if module in seen:
        return None
    seen.add(module)
    if any(
        base == "torch" or base.startswith("torch.") for base, _ in SOURCES[module].module_level
    ):
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
        for m in SOURCES
        if m == package or m.startswith(f"{package}.")
        if (chain := _loads_torch(m, set()))
    }
    assert offenders == {}

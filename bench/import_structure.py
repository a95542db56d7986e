"""The import structure of a tree's package, in the numbers issue 33 names: nodes, layers, edges,
edges running back up, cycles.

Usage::

    python bench/import_structure.py [tree ...]     # default: this tree

A *node* is a package or a top-level module of ``hyperexport`` (a package's submodules are one
node); a side folder (``product/``, ``engine/``, ``library/``, ``base/``) is not a node itself:
its packages and modules are, so a tree before and after the folders count alike. An *edge* is
a node importing another (at module level or inside a function; ``__init__`` counted as the
node's; the package's own ``__init__`` is a node). *Layers* are the length of the longest chain of edges plus one; an edge *back up* is
one in a cycle's strongly connected component (none when there is no cycle). Nothing is
imported: the files are parsed with ``ast``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "hyperexport"
SIDES = ("product", "engine", "library", "base")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def node_of(module: str) -> str | None:
    """``hyperexport.product.cli.build`` -> ``hyperexport.product.cli``; ``hyperexport.library.check.judge`` ->
    ``hyperexport.library.check``; None outside the package, the package's ``__init__`` is
    ``hyperexport``."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1:
        return PACKAGE
    if parts[1] in SIDES and parts[1] != "engine" and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names ``source`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                if not is_package:
                    base_parts = base_parts[:-1]
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def graph_of(tree: Path) -> dict[str, set[str]]:
    root = tree / PACKAGE
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        modules[_module_name(root, path)] = path
    nodes = {n for m in modules if (n := node_of(m))}
    nodes -= {f"{PACKAGE}.{side}" for side in SIDES if side != "engine"}
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for module, path in modules.items():
        here = node_of(module)
        if here not in graph:
            continue
        names = imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        for name in names:
            there = node_of(name)
            # every module loads the package's __init__ first: not an edge of it
            if there in graph and there not in (here, PACKAGE) and name in modules:
                graph[here].add(there)
    return graph


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[set[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def structure(tree: Path) -> dict[str, int]:
    graph = graph_of(tree)
    cycles = _components(graph)
    in_cycle = {n for part in cycles for n in part}
    back = sum(1 for a, ts in graph.items() for b in ts if a in in_cycle and b in in_cycle)
    depth: dict[str, int] = {}

    def longest(n: str, seen: frozenset[str]) -> int:
        if n in depth:
            return depth[n]
        d = 1 + max((longest(t, seen | {n}) for t in graph[n] if t not in seen), default=0)
        depth[n] = d
        return d

    layers = max((longest(n, frozenset()) for n in graph), default=0)
    return {
        "nodes": len(graph),
        "layers": layers,
        "edges": sum(len(t) for t in graph.values()),
        "back_up": back,
        "cycles": len(cycles),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, default=[Path(__file__).parent.parent])
    args = parser.parse_args()
    for tree in args.trees:
        s = structure(tree)
        print(
            f"{tree}: {s['nodes']} packages/top-level modules, {s['layers']} layers, "
            f"{s['edges']} import edges, {s['back_up']} back up, {s['cycles']} cycles"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Static import resolution: find a module's source and its top-level names without importing it."""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from pathlib import Path

from hyperexport.errors import did_you_mean


# --------------------------------------------------------------------------------------------
# Static import checks (no import: validation must not load torch)
# --------------------------------------------------------------------------------------------
def split_import_path(path: str) -> tuple[str, str]:
    """``"a.b:C"`` or ``"a.b.C"`` -> ``("a.b", "C")``."""
    if ":" in path:
        module, _, attr = path.partition(":")
        return module, attr
    module, _, attr = path.rpartition(".")
    return module, attr


def _locate_module(module: str) -> Path | str | None:
    """The source file of ``module`` found without importing it (or its parents).

    Returns:
        The file; an error message naming the missing part (with a close match); or None when
        the module exists but has no Python source to inspect.
    """
    parts = module.split(".")
    if module in sys.modules:
        origin = getattr(sys.modules[module], "__file__", None)
        return Path(origin) if origin and origin.endswith(".py") else None
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        return f"no module named {parts[0]!r}"
    if len(parts) == 1:
        return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        found: Path | None = None
        siblings: set[str] = set()
        for loc in locations:
            base = Path(loc)
            if (base / part / "__init__.py").is_file() or (base / part).is_dir():
                found = base / part
                break
            if (base / f"{part}.py").is_file():
                found = base / f"{part}.py"
                break
            if base.is_dir():
                siblings |= {p.stem for p in base.iterdir() if p.suffix == ".py" or p.is_dir()}
        if found is None:
            prefix = ".".join(parts[:i])
            candidates = sorted(f"{prefix}.{s}" for s in siblings)
            missing = ".".join(parts[: i + 1])
            return f"no module named {missing!r}{did_you_mean(missing, candidates)}"
        if found.suffix == ".py":
            return found if i == len(parts) - 1 else f"{found} is not a package"
        locations = [str(found)]
        if i == len(parts) - 1:
            init = found / "__init__.py"
            return init if init.is_file() else None
    return None


@functools.lru_cache(maxsize=64)
def _top_level_names(path: Path) -> frozenset[str]:
    """Names bound at the top level of a Python source file (classes, defs, imports, assigns)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()
    for node in ast.walk(tree) if path.name == "__init__.py" else tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)

"""Static import resolution: find a module's source and its top-level names without importing it."""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from hyperexport.base.errors import did_you_mean


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
    tree = _parsed(path)
    if tree is None:
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


# --------------------------------------------------------------------------------------------
# What a factory accepts, read from its source (for the arguments beside a ``_target_``)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Parameters:
    """The parameters of a function, or of a class's ``__init__`` (``self`` left out), as
    its source declares them.

    Attributes:
        positional: The names that may be passed by position, in order.
        keyword: The names that may be passed by keyword.
        required: The names without a default.
        var_positional: It takes ``*args``.
        var_keyword: It takes ``**kwargs``.
    """

    positional: tuple[str, ...]
    keyword: frozenset[str]
    required: frozenset[str]
    var_positional: bool
    var_keyword: bool


#: How many ``from x import name`` re-exports are followed to find where a name is defined.
_MAX_REEXPORTS = 4


def static_parameters(path: str) -> Parameters | None:
    """What the callable at import path ``path`` accepts, read from Python source, never imported.

    Found when ``path`` names a function, or a class whose body defines ``__init__``, bound
    once at the top level of its module (or re-exported there by ``from x import name``), with
    no decorator (which may change what it accepts) and no metaclass.

    Returns:
        Its parameters, or None when they cannot be read from the source.
    """
    module, attr = split_import_path(path)
    for _ in range(_MAX_REEXPORTS + 1):
        located = _locate_module(module)
        if not isinstance(located, Path):
            return None
        binding = _top_level_binding(located, attr)
        if isinstance(binding, ast.ImportFrom):
            origin = _imported_module(binding, module, located)
            if origin is None:
                return None
            alias = next(a for a in binding.names if (a.asname or a.name) == attr)
            module, attr = origin, alias.name
            continue
        if isinstance(binding, ast.FunctionDef) and not binding.decorator_list:
            return _parameters(binding.args, skip_first=False)
        if isinstance(binding, ast.ClassDef):
            return _init_parameters(binding)
        return None
    return None


@functools.lru_cache(maxsize=64)
def _parsed(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _top_level_binding(path: Path, name: str) -> ast.stmt | None:
    """The one statement at the top level of ``path`` that binds ``name``; None when there is
    none, or when a compound statement (``if``, ``try``, ...) may bind it too."""
    tree = _parsed(path)
    if tree is None:
        return None
    found: ast.stmt | None = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                found = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name).split(".")[0] == name for a in node.names):
                found = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                found = node
        elif _binds_anywhere(node, name):
            return None
    return found


def _binds_anywhere(node: ast.AST, name: str) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if sub.name == name:
                return True
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name).split(".")[0] == name for a in sub.names):
                return True
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub.id == name:
            return True
    return False


def _imported_module(node: ast.ImportFrom, module: str, path: Path) -> str | None:
    """The absolute name of the module ``from ... import`` reads, in ``module`` (at ``path``)."""
    if not node.level:
        return node.module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else None


def _init_parameters(node: ast.ClassDef) -> Parameters | None:
    if node.decorator_list or any(k.arg == "metaclass" for k in node.keywords):
        return None
    inits = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    if len(inits) != 1 or inits[0].decorator_list:
        return None
    return _parameters(inits[0].args, skip_first=True)


def _parameters(args: ast.arguments, *, skip_first: bool) -> Parameters:
    ordered = [*args.posonlyargs, *args.args]
    with_default = (
        {a.arg for a in ordered[len(ordered) - len(args.defaults) :]} if args.defaults else set()
    )
    if skip_first:
        ordered = ordered[1:]
    positional_only = {a.arg for a in args.posonlyargs}
    keyword_only = [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    keyword_required = {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None}
    return Parameters(
        positional=tuple(a.arg for a in ordered),
        keyword=frozenset(
            {a.arg for a in ordered if a.arg not in positional_only} | set(keyword_only)
        ),
        required=frozenset(
            {a.arg for a in ordered if a.arg not in with_default} | keyword_required
        ),
        var_positional=args.vararg is not None,
        var_keyword=args.kwarg is not None,
    )

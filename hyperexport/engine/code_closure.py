"""The code a stage runs, computed from the import graph of a package's sources.

The caller names the package whose code the stages' keys cover (:class:`CodePackage`). A
stage's key holds the content digests of that package's modules it can execute, found by
parsing the sources (never importing them): no hand-kept list goes stale. Each module reached
is either *used* or only *loaded*:

* the stage's own module is used, and so is every package module a used module imports, at
  module level or inside a function: the stage may call into it;
* a parent package of a reached module is only loaded (importing ``a.b.c`` runs ``a`` and
  ``a.b``), and so is whatever a loaded module imports at module level.

A used module's function-level imports are followed; a loaded module's are not: importing
``pkg.stages.check`` runs ``pkg/stages/__init__.py``, which may import another stage's module,
but the check stage never calls that stage's ``run`` and its function-level imports. Imports
under ``if TYPE_CHECKING:`` never run and are skipped.
"""

from __future__ import annotations

import ast
import hashlib
import io
import logging
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hashing import JsonMemo

log = logging.getLogger(__name__)

USED, LOADED = "used", "loaded"


@dataclass(frozen=True)
class CodePackage:
    """The package whose code the stages' keys cover.

    Attributes:
        name: Its import name (``pkg``); its modules are ``pkg`` and ``pkg.*``.
        root: Its folder (holding ``__init__.py``).
    """

    name: str
    root: Path

    @classmethod
    def of(cls, module: Any) -> CodePackage:
        """The package of an imported top-level package ``module``."""
        return cls(module.__name__, Path(module.__file__).resolve().parent)


@dataclass(frozen=True)
class ModuleSource:
    """One module of the package: its file, whether it is a package, and what it imports.

    Attributes:
        name: Dotted module name (``pkg.check.report``).
        relpath: File path relative to the package's parent (``pkg/check/report.py``).
        digest: sha256 of the file's tokens without comments (:func:`token_digest`).
        module_level: Import statements that run when the module is loaded.
        function_level: Import statements inside its functions.
    """

    name: str
    relpath: str
    digest: str
    module_level: tuple[Import, ...]
    function_level: tuple[Import, ...]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


#: One import statement: the module it names and the names it takes from it
#: (``import a.b`` -> ``("a.b", ())``; ``from a import b, c`` -> ``("a", ("b", "c"))``).
Import = tuple[str, tuple[str, ...]]


def _statement(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[Import]:
    if isinstance(node, ast.Import):
        return [(alias.name, ()) for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [(base, tuple(alias.name for alias in node.names))]


def _imports(tree: ast.Module, module: str, is_package: bool) -> tuple[list[Import], list[Import]]:
    """``(module-level, function-level)`` import statements of a parsed module."""
    module_level: list[Import] = []
    function_level: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out = function_level if in_function else module_level
            out.extend(_statement(node, module, is_package))
            return
        inside = in_function or isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        for sub in ast.iter_child_nodes(node):
            visit(sub, inside)

    visit(tree, False)
    return module_level, function_level


_NOT_CODE = frozenset((tokenize.COMMENT, tokenize.NL))


def token_digest(data: bytes) -> str:
    """sha256 of a Python source's tokens without comments and blank lines.

    A comment, a blank line or spacing inside a line cannot change what the code does, so it
    changes no key; docstrings are strings the code can read, and count. A source that does
    not tokenize is keyed by its bytes.
    """
    digest = hashlib.sha256()
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type not in _NOT_CODE:
                digest.update(f"{tok.type}:{tok.string}\0".encode())
    except (tokenize.TokenError, SyntaxError) as e:
        log.debug("cannot tokenize (%s); keyed by bytes", e)
        return hashlib.sha256(data).hexdigest()
    return digest.hexdigest()


def _parse(data: bytes, path: Path, name: str) -> tuple[list[Import], list[Import]]:
    try:
        tree = ast.parse(data, filename=str(path))
    except SyntaxError as e:
        # The module cannot run either; its bytes are still keyed, its imports are unknown.
        log.warning("cannot parse %s for its imports: %s", path, e)
        tree = ast.Module(body=[], type_ignores=[])
    return _imports(tree, name, path.name == "__init__.py")


#: The import memo's file name: in a cache's ``index/``, or in an outer keyed loader's folder
#: where every cache shares it.
IMPORT_MEMO = "imports.json"
#: At most this many parsed modules in the shared memo (a few versions of a large package).
SHARED_MEMO_ENTRIES = 4096


class ImportMemo(JsonMemo):
    """Parsed import statements by file digest, kept in a JSON file (``index/imports.json``,
    or one shared by every cache beside the command line's compiled files: the runner's
    ``_share_import_memo``).

    Parsing every package source costs about 1.8 s (224 modules, measured idle), more than a
    no-op build; a
    file whose digest was parsed before is not parsed again. A malformed memo is ignored with a
    WARNING (it is only a cache of what parsing gives).

    Args:
        path: The memo file, or None to keep it in memory.
        read_only: Never write the file.
        bounded: Keep at most :data:`SHARED_MEMO_ENTRIES` (a memo that every cache shares, and
            that no cache's collector trims).
    """

    what = "import memo"

    def __init__(
        self, path: Path | None, *, read_only: bool = False, bounded: bool = False
    ) -> None:
        super().__init__(path, read_only=read_only)
        self._bounded = bounded
        self._used: set[str] = set()

    @property
    def shareable(self) -> bool:
        """Not yet consulted: another memo can take its place for this build."""
        return self._entries is None

    def get(self, key: str) -> tuple[tuple[list[Import], list[Import]], str] | None:
        """The ``(module-level, function-level)`` imports and the token digest recorded for
        ``key``, if well-formed."""
        self._used.add(key)
        value: Any = self._load().get(key)
        try:
            imports = _statements(value[0]), _statements(value[1])
            tokens = value[2]
        except (TypeError, ValueError, IndexError, KeyError):
            return None
        return (imports, tokens) if isinstance(tokens, str) else None

    def put(self, key: str, imports: tuple[list[Import], list[Import]], tokens: str) -> None:
        self._used.add(key)
        self._set(key, [*([[b, list(n)] for b, n in part] for part in imports), tokens])

    def save(self) -> None:
        """Write the memo if it changed; a failed write is a WARNING (the next build parses).

        A bounded memo (one shared by every cache) keeps at most :data:`SHARED_MEMO_ENTRIES`:
        every entry this process used, and others in the file's order up to the bound.
        """
        if self._bounded and self._dirty:
            entries = self._load()
            if len(entries) > SHARED_MEMO_ENTRIES:
                others = [k for k in entries if k not in self._used]
                drop = set(others[: len(entries) - SHARED_MEMO_ENTRIES])
                self._entries = {k: v for k, v in entries.items() if k not in drop}
        try:
            super().save()
        except OSError as e:  # only a memo: the next build parses again
            log.warning("cannot save the import memo %s (%s); not memoised", self._path, e)
            self._dirty = False


def _statements(value: Any) -> list[Import]:
    out: list[Import] = []
    for base, names in value:
        if not isinstance(base, str) or not all(isinstance(n, str) for n in names):
            raise ValueError("malformed import statement")
        out.append((base, tuple(names)))
    return out


def read_package(root: Path, memo: ImportMemo | None = None) -> dict[str, ModuleSource]:
    """Every module of the package at ``root``: file, digest and imports."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = _module_name(path, root)
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        memo_key = f"{name}:{digest}"  # relative imports resolve against the module's name
        found = memo.get(memo_key) if memo is not None else None
        if found is None:
            found = _parse(data, path, name), token_digest(data)
            if memo is not None:
                memo.put(memo_key, *found)
        imports, tokens = found
        sources[name] = ModuleSource(
            name=name,
            relpath=path.relative_to(root.parent).as_posix(),
            digest=tokens,
            module_level=tuple(imports[0]),
            function_level=tuple(imports[1]),
        )
    return sources


_READ: dict[Path, dict[str, ModuleSource]] = {}


def package_sources(
    package: CodePackage, memo: ImportMemo | None = None
) -> dict[str, ModuleSource]:
    """:func:`read_package` of ``package``, once per process: the code a process runs cannot
    change while it runs."""
    if package.root not in _READ:
        _READ[package.root] = read_package(package.root, memo)
    return _READ[package.root]


def _parents(name: str) -> Iterator[str]:
    while "." in name:
        name = name.rpartition(".")[0]
        yield name


def closure(roots: Iterable[str], sources: dict[str, ModuleSource]) -> dict[str, str]:
    """``{relpath: digest}`` of the package modules that running ``roots`` can execute.

    Args:
        roots: Dotted names of the modules the stage uses (its own module, and any package
            module the build's configuration names, such as a model factory). Names outside
            the package are ignored.
        sources: The package's modules (:func:`package_sources`).
    """
    mode: dict[str, str] = {}
    queue: list[tuple[str, str]] = [(r, USED) for r in roots]

    def follow(statements: Iterable[Import], how: str) -> None:
        for base, names in statements:
            submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in sources]
            queue.extend((m, how) for m in submodules)
            # ``from pkg import submodule`` only loads pkg; ``from pkg import name`` uses it.
            queue.append((base, how if len(submodules) < len(names) or not names else LOADED))

    while queue:
        name, how = queue.pop()
        if name not in sources or mode.get(name) in (how, USED):
            continue
        mode[name] = how
        source = sources[name]
        queue += [(p, LOADED) for p in _parents(name)]
        follow(source.module_level, how)
        if how == USED:
            follow(source.function_level, USED)
    return {sources[n].relpath: sources[n].digest for n in sorted(mode)}


def stage_code(
    stage_module: str, extra_roots: Iterable[str], sources: dict[str, ModuleSource]
) -> dict[str, str]:
    """The code digest material of a stage defined in ``stage_module``.

    Args:
        stage_module: The module defining the stage's class.
        extra_roots: Other package modules the stage runs (a model factory the build's
            configuration names inside the package, for a stage that runs the model).
        sources: The keyed package's modules (:func:`package_sources`; empty: no code keyed).

    A stage defined outside the package (a test's or a user's) contributes its own imports of
    the package, found the same way from its source file.
    """
    roots = [stage_module, *extra_roots]
    if stage_module not in sources:
        roots += _outside_imports(stage_module, sources)
    return closure(roots, sources)


def _outside_imports(module: str, sources: dict[str, ModuleSource]) -> list[str]:
    import sys

    file = getattr(sys.modules.get(module), "__file__", None)
    if not file or not file.endswith(".py"):
        return []
    path = Path(file)
    tree = ast.parse(path.read_bytes(), filename=file)
    module_level, function_level = _imports(tree, module, path.name == "__init__.py")
    found = []
    for base, names in (*module_level, *function_level):
        found += [base, *(f"{base}.{n}" for n in names)]
    return [m for m in found if m in sources]

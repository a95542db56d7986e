"""What runs is what is keyed: Python source compiled from the bytes that enter a key.

A stage's key covers the content of the Python modules it runs (the keyed package's code it
runs, and for a stage that runs the model every module it had loaded: :mod:`.discovered`). CPython,
though, may run a module from ``__pycache__``: a timestamp ``.pyc`` is trusted when its recorded
source mtime and size match, so an edit that keeps both (a tool that restores mtimes, a same-size
change within the filesystem's timestamp granularity) runs the *old* code while the key hashes the
*new* source, and a result of the old code is stored under the new source's key.

Inside :func:`keyed_imports`, every module found as a source file is loaded by
:class:`KeyedSourceLoader`, which

* reads the source bytes once, records their sha256 (:func:`compiled_digest`: the digest a key
  then uses for that module), and
* runs bytecode only from a *checked hash-based* ``.pyc`` (PEP 552) of its own, validated
  against those bytes (:func:`importlib.util.source_hash`), in a folder of its own
  (``bytecode_dir``), never the timestamp ``.pyc`` beside the source: otherwise it compiles the
  bytes it read, and stores the checked ``.pyc`` for the next process.

So the code that runs is compiled from exactly the bytes whose digest is keyed. The cost is one
read and two hashes of each source file imported (about 0.2 s for 58 MB of source, measured on
the project's machine), and, the first time a file is met, its compilation (about 20 s for the
same). The folder belongs to the build cache, not to Python's
``__pycache__``: it is written whatever ``PYTHONDONTWRITEBYTECODE`` says, which governs only
the latter (the machines this project runs on set it, and rely on the ``.pyc`` files pip wrote
at install time). Modules
imported before the block (the interpreter's start-up, the command line itself) keep their
loaders: they are keyed by their file's content, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import logging
import marshal
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

log = logging.getLogger(__name__)

#: PEP 552 flags of a hash-based .pyc whose hash is checked against the source on every load.
_CHECKED_HASH = 0b11
_HEADER = 16  # magic (4), flags (4), source hash (8)

_lock = threading.Lock()
_digests: dict[str, str] = {}  # source path -> sha256 of the bytes compiled
_depth = 0
_finder: _KeyedFinder | None = None


def active_bytecode_dir() -> Path | None:
    """The folder the keyed loader keeps its .pyc files in now (None outside a block): what it
    reads there is the loader's, not the model's (:mod:`.opened` must not key it)."""
    finder = _finder
    return None if finder is None else finder.loader.bytecode_dir


def compiled_digest(path: str | os.PathLike[str]) -> str | None:
    """The sha256 of the source bytes :class:`KeyedSourceLoader` compiled for ``path`` (as
    the module's ``__file__`` names it), or None if it did not load that file."""
    return _digests.get(os.fspath(path))


class KeyedSourceLoader(importlib.machinery.SourceFileLoader):
    """A source loader that runs only bytecode compiled from the bytes it hashed."""

    #: Where checked .pyc files are kept (None: compile every time, store nothing).
    bytecode_dir: Path | None = None

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        data = self.get_data(path)
        with _lock:
            _digests[path] = hashlib.sha256(data).hexdigest()
        source_hash = importlib.util.source_hash(data)
        cached = _bytecode_path(self.bytecode_dir, path)
        code = _read_checked(cached, source_hash) if cached is not None else None
        if code is None:
            code = self.source_to_code(data, path)
            if cached is not None:  # the build cache's, not __pycache__: written regardless
                _write_checked(cached, code, source_hash)  # of PYTHONDONTWRITEBYTECODE
        return code


def _bytecode_path(root: Path | None, source: str) -> Path | None:
    """``<root>/<absolute source folder>/<name>.<cache tag>.pyc`` (like ``sys.pycache_prefix``)."""
    if root is None or sys.implementation.cache_tag is None:
        return None
    src = Path(source)
    if not src.is_absolute():
        return None
    relative = Path(*src.parent.parts[1:])  # drop the root ("/"): mirrored below ``root``
    return root / relative / f"{src.stem}.{sys.implementation.cache_tag}.pyc"


def _read_checked(path: Path, source_hash: bytes) -> CodeType | None:
    """The code object of a checked hash-based .pyc matching ``source_hash``, else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if (
        len(data) <= _HEADER
        or data[:4] != importlib.util.MAGIC_NUMBER
        or int.from_bytes(data[4:8], "little") != _CHECKED_HASH
        or data[8:16] != source_hash
    ):
        return None
    try:
        code = marshal.loads(data[_HEADER:])
    except (EOFError, ValueError, TypeError) as e:
        log.debug("unreadable bytecode %s (%s); compiling", path, e)
        return None
    return code if isinstance(code, CodeType) else None


def _write_checked(path: Path, code: CodeType, source_hash: bytes) -> None:
    """Store ``code`` as a checked hash-based .pyc, atomically; a failure only costs speed."""
    body = (
        importlib.util.MAGIC_NUMBER
        + _CHECKED_HASH.to_bytes(4, "little")
        + source_hash
        + marshal.dumps(code)
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        log.debug("cannot store bytecode %s (%s); it is compiled again next time", path, e)


class _KeyedFinder:
    """A meta path finder placed first: it asks the finders behind it, and where one answers
    with the plain :class:`~importlib.machinery.SourceFileLoader` (the path finder, an editable
    install's finder), hands the module to :class:`KeyedSourceLoader` instead."""

    def __init__(self, loader: type[KeyedSourceLoader]) -> None:
        self.loader = loader

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if type(spec.loader) is importlib.machinery.SourceFileLoader:
                source = spec.loader.path
                spec.loader = self.loader(fullname, source)
                spec.loader_state = None
            return spec
        return None

    def invalidate_caches(self) -> None:
        """Nothing of its own to forget (the finders behind it are asked by importlib)."""


@contextlib.contextmanager
def keyed_imports(bytecode_dir: Path | None) -> Iterator[None]:
    """Load every source module imported inside the block with :class:`KeyedSourceLoader`.

    Re-entrant (an inner block keeps the outer one's folder); the finder is removed when the
    outermost block ends, and the modules it loaded keep their loader.

    Args:
        bytecode_dir: Where checked .pyc files are kept; None compiles without storing.
    """
    global _depth, _finder
    with _lock:
        _depth += 1
        if _finder is None:
            loader: Any = type(
                "KeyedSourceLoader", (KeyedSourceLoader,), {"bytecode_dir": bytecode_dir}
            )
            _finder = _KeyedFinder(loader)
            sys.meta_path.insert(0, _finder)  # type: ignore[arg-type]
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _finder is not None:
                if _finder in sys.meta_path:
                    sys.meta_path.remove(_finder)  # type: ignore[arg-type]
                _finder = None


def default_bytecode_dir(cache_root: Path) -> Path:
    """The checked .pyc folder of a cache root (``<root>/bytecode``)."""
    return cache_root / "bytecode"

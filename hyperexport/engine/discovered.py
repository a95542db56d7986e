"""Discovered dependencies of the stages that run user code (ccache's direct mode).

A build's configuration declares the model's factory and the classes it names, but not what
their modules import in turn (a helper module beside the model, a local package). So a stage that runs
user code records, after it ran, every module present in ``sys.modules`` outside the standard
library: all of them, not only those it imported, since sweep jobs under Hydra's basic launcher
share one process. The record is a *dependency set*:

* every module's file, local, editable or installed in site-packages, by module name, file
  (relative to the folder its top-level package was found in) and content digest: an edited
  installed library (a local patch, a vendored fix) is a change like an edited helper;
* installed distributions by name and version, one entry per distribution (for the reason:
  ``numpy 1.26.4→2.0.0``);
* the files the stage opened for reading or loaded with ``ctypes`` (:mod:`.opened`), by
  content, named relative to the ``sys.path`` folder holding them (else by their absolute path).

Modules that the build's own machinery loaded before any model ran (:func:`.machinery.machinery`:
the remote tier's fsspec) are left out, so that a build setting never changes a key.

The keyed package's own modules are left out, and the engine's: the code a stage runs is in its
key already (:mod:`.code_closure`). Nothing is keyed by an absolute path, so a cache moved to
another checkout or machine still hits.

Keys have two levels. The *declared* key hashes what the stage declares (its params, upstream
outputs, code, libraries, the model). Under it, ``<cache>/deps/<aa>/<declared>.json``
lists the dependency sets seen for it, newest first. A lookup re-fingerprints each set, without
importing anything (files are found from the top-level package's location, versions from
package metadata); the first set that still holds gives the full key,
``sha256(declared key, set digest)``, under which the stage's outputs are stored. When none
holds, the stage reruns, and the reason names what changed (``model code changed
(myhelpers.py)``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata as metadata
import importlib.util
import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .environment import SITE_DIRS, distribution_version
from .hashing import (
    FileDigestIndex,
    atomic_write_canonical_json,
    canonical_json,
    sha256_text,
)
from .keyed_imports import compiled_digest
from .machinery import MACHINERY

log = logging.getLogger(__name__)

DEPS_FORMAT = 2
#: Format 1 keyed installed libraries by version only: its sets are not trusted.
_OLDER_FORMATS = (1,)
#: Dependency sets kept per declared key (newest first); older ones are dropped.
MAX_SETS = 8
#: Never recorded: the scripts, and the engine's own top-level package.
_NOT_RECORDED = frozenset((__name__.partition(".")[0], "__main__", "__mp_main__"))
#: The top-level name prefix of the import hooks an editable install writes (setuptools,
#: PEP 660): ``__editable___<name>_<version>_finder`` holds the checkout's absolute path. It is
#: the installer's machinery, not code the model runs: the modules it maps are recorded by
#: their own content.
_EDITABLE_FINDERS = "__editable__"


@functools.lru_cache(maxsize=8)
def _package_machinery(package: str | None) -> frozenset[str]:
    """Top-level names the keyed package's own distribution installs besides the package (an
    editable install's finder): its code is keyed by its sources already."""
    owners = _distributions_by_top().get(package) or [] if package else []
    return frozenset(
        top for top, dists in _distributions_by_top().items() if set(dists) & set(owners)
    )


def _not_recorded(top: str, package: str | None) -> bool:
    return (
        top in _NOT_RECORDED
        or top == package
        or top.startswith(_EDITABLE_FINDERS)
        or top in _package_machinery(package)
    )


#: ``{"modules": {name: [relative file, digest]}, "dists": {name: version},
#: "files": {relative or absolute path: digest}}``.
DependencySet = dict[str, dict[str, Any]]


def _is_stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


@functools.lru_cache(maxsize=1)
def _distributions_by_top() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _path_entries() -> list[Path]:
    """The folders of ``sys.path`` and the working directory (resolved), longest first.

    Files are named relative to the longest that holds them, so that a checkout, a virtualenv
    or a working directory elsewhere names them alike: the console script's ``sys.path`` lacks
    the working directory that ``python -m`` puts first. The filesystem's root is never one.
    """
    entries = {Path(p or ".").resolve() for p in sys.path if isinstance(p, str)}
    entries.add(Path.cwd().resolve())
    return sorted(
        (e for e in entries if e.is_dir() and len(e.parts) > 1),
        key=lambda e: len(e.parts),
        reverse=True,
    )


@dataclasses.dataclass(frozen=True)
class _Place:
    """Where a loaded module's file sits, worked out once per process (pure path arithmetic and
    one ``realpath``): a snapshot names every loaded module (thousands), each build takes
    several, and a module's name, file and ``sys.path`` rarely change between them. Only the
    file's content is read again each time (its stat-keyed digest), so nothing can go stale."""

    name: str  # the name it is recorded under: the module's, or its top-level module's
    file: str
    site_top: str | None  # its top-level name in site-packages, if installed there
    in_stdlib: bool
    label: str  # relative to its sys.path folder or package (absolute when neither holds it)
    realpath: str


#: ``{sys.path folders: {(module name, its __file__): place, or None when not recorded}}``.
_PLACES: dict[tuple[str, ...], dict[tuple[str, str], _Place | None]] = {}


def _place(name: str, file: str, top: str, entries: list[Path]) -> _Place | None:
    path = Path(file)
    if not path.is_absolute():
        # Namespace packages, modules made at run time, and submodules with a relative
        # __file__ (made by a library at run time): keyed through their top-level module.
        top_module = sys.modules.get(top)
        top_path = _module_file(top_module) if top_module is not None else None
        if top_path is None or not top_path.is_absolute():
            return None
        name, path = top, top_path
    site_top = _site_top(path)
    in_stdlib = site_top is None and _in_stdlib(path)
    label = _relative_file(name, path, entries)
    if label is None and not in_stdlib:
        log.warning(
            "module %s (%s) cannot be named relative to its package; the cache keys it "
            "by its absolute path",
            name,
            path,
        )
    return _Place(
        name, str(path), site_top, in_stdlib, label or path.as_posix(), os.path.realpath(path)
    )


def _relative_file(name: str, file: Path, entries: list[Path]) -> str | None:
    """The file relative to the ``sys.path`` folder (``entries``) holding it, else to the
    folder its top-level package sits in.

    ``a/b/c.py`` for module ``a.b.c`` at ``/x/a/b/c.py`` with ``/x`` on ``sys.path``. The
    ``sys.path`` folder comes first: a module registered under a name that does not match its
    place (a Cython utility module ``_cyutility`` living in ``scipy/_lib/``) is found there
    again. The package folder serves editable installs that map a package from outside
    ``sys.path``. None if neither applies.
    """
    for entry in entries:
        if file.is_relative_to(entry):
            return file.relative_to(entry).as_posix()
    parts = name.split(".")
    depth = len(parts) if file.stem == "__init__" else len(parts) - 1
    if depth < len(file.parents):
        rel = file.relative_to(file.parents[depth])
        if rel.parts[0].split(".")[0] == parts[0]:
            return rel.as_posix()
    return None


def _module_file(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file) if isinstance(file, str) and file else None


def _site_top(file: Path) -> str | None:
    """The top-level name a file installed in site-packages belongs to (``scipy`` for
    ``.../site-packages/scipy/sparse/_x.so``); None for a file outside site-packages."""
    parts = file.parts
    for i, part in enumerate(parts[:-1]):
        if part in SITE_DIRS:
            return parts[i + 1].split(".")[0]
    return None


@functools.lru_cache(maxsize=1)
def _stdlib_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple(Path(paths[k]).resolve() for k in ("stdlib", "platstdlib") if k in paths)


def _in_stdlib(file: Path) -> bool:
    """A file of the standard library (``_sysconfigdata_*``, ``lib-dynload``), by location."""
    return any(file.is_relative_to(d) for d in _stdlib_dirs())


def snapshot(
    index: FileDigestIndex, opened: Iterable[str] = (), package: str | None = None
) -> DependencySet:
    """The dependency set of this process now: every non-stdlib module in ``sys.modules``
    (installed ones too, by content) but ``package``'s (keyed by its sources) and the
    engine's, and the regular files ``opened`` (absolute, resolved:
    :func:`.opened.regular_files`)."""
    modules: dict[str, list[str]] = {}
    dists: dict[str, str | None] = {}
    owners_of: dict[str, list[str] | None] = {}
    module_files: set[str] = set()
    entries = _path_entries()
    places = _PLACES.setdefault(tuple(map(str, entries)), {})
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if (
            _not_recorded(top, package)
            or name in MACHINERY
            or _is_stdlib(top)
            or not isinstance(module, ModuleType)
        ):
            continue
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file:
            file = ""
        if (name, file) not in places:
            places[(name, file)] = _place(name, file, top, entries)
        place = places[(name, file)]
        if place is None:
            continue
        if place.site_top is not None:
            if place.site_top not in owners_of:
                owners_of[place.site_top] = _distributions_by_top().get(place.site_top) or None
            owners = owners_of[place.site_top]
            if owners is not None:  # its version names the change; its files are keyed below
                dists.update((dist, distribution_version(dist)) for dist in owners)
        elif place.in_stdlib:
            continue
        if place.name in modules:
            continue
        try:
            # What ran: the bytes the keyed loader compiled, when it loaded the module
            # (keyed_imports.py); else the file as it is now.
            ran = compiled_digest(place.file) or index.digest_at(place.file)
            modules[place.name] = [place.label, ran]
            module_files.add(place.realpath)
        except OSError as e:  # deleted since it was imported: nothing to validate it against
            log.warning("module %s: cannot hash %s (%s); not recorded", place.name, place.file, e)
    files: dict[str, str] = {}
    for path in opened:
        if path in module_files or _in_stdlib(Path(path)) or Path(path).is_relative_to(_OWN_DIR):
            continue
        try:
            files[_file_label(path, entries)] = index.digest_at(path)
        except OSError as e:
            log.warning("cannot hash %s, which the model opened (%s); not recorded", path, e)
    return {
        "modules": dict(sorted(modules.items())),
        "dists": dict(sorted(dists.items())),
        "files": dict(sorted(files.items())),
    }


_OWN_DIR = Path(__file__).resolve().parent.parent


def _file_label(path: str, entries: list[Path]) -> str:
    """A file named relative to the longest ``sys.path`` folder holding it, else absolute."""
    for entry in entries:
        if Path(path).is_relative_to(entry):
            return Path(path).relative_to(entry).as_posix()
    return path


def set_digest(deps: DependencySet) -> str:
    """sha256 of the canonical JSON of a dependency set."""
    return sha256_text(canonical_json(deps))


def full_key(declared: str, deps: DependencySet) -> str:
    """The key a stage's outputs are stored under: its declared key and what it loaded."""
    return sha256_text(canonical_json({"declared": declared, "discovered": set_digest(deps)}))


def _package_roots(top: str) -> list[Path]:
    """Folders in which top-level module ``top`` is found now, without importing it."""
    module = sys.modules.get(top)
    if module is not None:
        locations = list(getattr(module, "__path__", None) or [])
        file = _module_file(module)
        if locations:
            return [Path(loc).parent for loc in locations]
        return [file.parent] if file is not None else []
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as e:
        log.debug("cannot locate %s: %s", top, e)
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(loc).parent for loc in spec.submodule_search_locations]
    if spec.origin and spec.has_location:
        return [Path(spec.origin).parent]
    return []


class _Locator:
    """Finds recorded files where they are now; folders of top-level packages memoised."""

    def __init__(self) -> None:
        self.entries = _path_entries()
        self._roots: dict[str, list[str]] = {}

    def roots(self, top: str) -> list[str]:
        if top not in self._roots:
            self._roots[top] = [str(r) for r in _package_roots(top)]
        return self._roots[top]

    def module_file(self, name: str, rel: str) -> str | None:
        """Where recorded file ``rel`` of module ``name`` is now: under its top-level
        package's folder (editable installs map packages outside ``sys.path``), else a
        ``sys.path`` folder."""
        if rel.startswith("/"):
            return rel if os.path.isfile(rel) else None
        for root in [*self.roots(name.partition(".")[0]), *map(str, self.entries)]:
            candidate = f"{root}/{rel}"
            if os.path.isfile(candidate):
                return candidate
        return None

    def data_file(self, label: str) -> str | None:
        if label.startswith("/"):
            return label if os.path.isfile(label) else None
        for entry in self.entries:
            candidate = f"{entry}/{label}"
            if os.path.isfile(candidate):
                return candidate
        return None


def changes(
    deps: DependencySet, index: FileDigestIndex, seen: dict[str, str | None] | None = None
) -> list[str]:
    """What no longer holds in ``deps``: ``["myhelpers.py", "numpy 1.26.4→2.0.0", ...]``.

    Module files are named by their recorded relative path (``… removed`` when gone), files
    the model read as ``file:<name>``, distributions by name and versions. Empty when every
    dependency still matches.

    Args:
        deps: A recorded dependency set.
        index: The digest index (stat-keyed fast path).
        seen: Digests found so far in this build (``{location: digest or None}``), shared
            between the stages so that a file is checked once.
    """
    found: list[str] = []
    where = _Locator()
    seen = {} if seen is None else seen

    def now(kind: str, name: str, rel: str) -> str | None:
        memo = f"{kind}:{name.partition('.')[0]}:{rel}"
        if memo not in seen:
            current = where.module_file(name, rel) if kind == "m" else where.data_file(rel)
            digest = None
            if current is not None:
                try:
                    digest = index.digest_at(current)
                except OSError as e:
                    log.warning("cannot hash %s: %s", current, e)
                    digest = ""
            seen[memo] = digest
        return seen[memo]

    for name, (rel, digest) in deps.get("modules", {}).items():
        current = now("m", name, rel)
        if current is None:
            found.append(f"{rel} removed")
        elif current != digest:
            found.append(rel)
    for label, digest in deps.get("files", {}).items():
        current = now("f", "", label)
        if current is None:
            found.append(f"file:{label} removed")
        elif current != digest:
            found.append(f"file:{label}")
    for dist, version in deps.get("dists", {}).items():
        now_version = distribution_version(dist)
        if now_version != version:
            found.append(f"{dist} {version}→{now_version}")
    return found


def describe(found: list[str], limit: int = 3) -> str:
    """A rerun reason from :func:`changes`: ``model code changed (myhelpers.py)``."""
    dists = [c for c in found if "→" in c]
    read = [c.removeprefix("file:") for c in found if c.startswith("file:")]
    files = [c for c in found if "→" not in c and not c.startswith("file:")]
    parts = []
    for what, names in (("model code changed", files), ("file read by the model changed", read)):
        if names:
            shown = ", ".join(names[:limit]) + (
                f", +{len(names) - limit} more" if len(names) > limit else ""
            )
            parts.append(f"{what} ({shown})")
    parts += dists[:limit]
    if len(dists) > limit:
        parts.append(f"+{len(dists) - limit} more")
    return ", ".join(parts)


@dataclass(frozen=True)
class Resolution:
    """What the recorded dependency sets of a declared key say now.

    Attributes:
        key: The full key of the first set that still holds, or None.
        reason: Why none holds (empty when there is no record at all, or a set holds).
    """

    key: str | None
    reason: str = ""


@dataclass
class DiscoveredDeps:
    """The dependency records of a cache, under ``<root>/deps/``.

    Args:
        root: The cache root.
        index: File digest index (stat-keyed fast path) for the source files.
        read_only: Never write (dry runs, read-only caches).
        package: The keyed package's name: its modules are never recorded.
    """

    root: Path
    index: FileDigestIndex
    read_only: bool = False
    package: str | None = None
    _memo: dict[str, list[DependencySet]] = field(default_factory=dict, repr=False)
    _seen: dict[str, str | None] = field(default_factory=dict, repr=False)

    def path(self, declared: str) -> Path:
        return self.root / "deps" / declared[:2] / f"{declared}.json"

    def sets(self, declared: str) -> list[DependencySet]:
        """The dependency sets recorded under ``declared`` (a corrupt record is a WARNING)."""
        if declared in self._memo:
            return self._memo[declared]
        path = self.path(declared)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable dependency record %s: %s", path, e)
            return []
        found = data.get("sets") if isinstance(data, dict) else None
        if isinstance(found, list) and data.get("format") in _OLDER_FORMATS:
            log.info("dependency record %s is of an older format; not used", path)
            return []
        if not isinstance(found, list) or data.get("format") != DEPS_FORMAT:
            log.warning("ignoring dependency record %s of an unknown format", path)
            return []
        valid = [s for s in found if _valid_set(s)]
        if len(valid) != len(found):
            log.warning(
                "dropping %d malformed dependency set(s) in %s", len(found) - len(valid), path
            )
        self._memo[declared] = valid
        return valid

    def resolve(self, declared: str) -> Resolution:
        """The full key of the first recorded set that still holds, else why none does."""
        first_change = ""
        for deps in self.sets(declared):
            found = changes(deps, self.index, self._seen)
            if not found:
                return Resolution(full_key(declared, deps))
            first_change = first_change or describe(found)
        return Resolution(None, first_change)

    def record(self, declared: str, opened: Iterable[str] = ()) -> str:
        """Snapshot this process's modules and the files ``opened`` as a set of ``declared``;
        returns the full key."""
        deps = snapshot(self.index, opened, self.package)
        if not self.read_only:
            kept = [s for s in self.sets(declared) if set_digest(s) != set_digest(deps)]
            sets = [deps, *kept][:MAX_SETS]
            atomic_write_canonical_json(self.path(declared), {"format": DEPS_FORMAT, "sets": sets})
            self._memo[declared] = sets
        return full_key(declared, deps)


def _valid_set(deps: Any) -> bool:
    if not isinstance(deps, dict):
        return False
    modules, dists, files = deps.get("modules"), deps.get("dists"), deps.get("files")
    if not isinstance(modules, dict) or not isinstance(dists, dict):
        return False
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return False
    return all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)
        for v in modules.values()
    ) and all(v is None or isinstance(v, str) for v in dists.values())


def recorded_keys(path: Path) -> frozenset[str] | None:
    """The full keys the dependency record at ``path`` (``<declared>.json``) can resolve to:
    what the collector holds against the entries on disk.

    Returns:
        The keys (empty for a record no build would use: unreadable, or of an older format),
        or None for a format newer than this version's, which is left alone.
    """
    declared = path.name.removesuffix(".json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # gone meanwhile, or unreadable: a lookup ignores it too
        return frozenset()
    if not isinstance(data, dict):
        return frozenset()
    version = data.get("format")
    if isinstance(version, int) and version > DEPS_FORMAT:
        return None
    sets = data.get("sets")
    if version != DEPS_FORMAT or not isinstance(sets, list):
        return frozenset()
    return frozenset(full_key(declared, s) for s in sets if _valid_set(s))

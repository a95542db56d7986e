"""Discovered dependencies of the stages that run user code (ccache's direct mode).

A recipe declares the model's factory, hiera classes and custom-op symbolics, but not what their
modules import in turn (a helper module beside the model, a local package). So a stage that runs
user code records, after it ran, every module present in ``sys.modules`` outside the standard
library: all of them, not only those it imported, since sweep jobs under Hydra's basic launcher
share one process. The record is a *dependency set*:

* local and editable sources by module name, file (relative to the folder its top-level
  package was found in) and content digest;
* installed distributions by name and version, one entry per distribution.

hyperexport's own modules are left out: the code a stage runs is in its key already
(:mod:`hyperexport.engine.code_closure`). Nothing is keyed by an absolute path, so a cache moved
to another checkout or machine still hits.

Keys have two levels. The *declared* key hashes what the stage declares (its params, upstream
outputs, code, libraries, the recipe's model). Under it, ``<cache>/deps/<aa>/<declared>.json``
lists the dependency sets seen for it, newest first. A lookup re-fingerprints each set, without
importing anything (files are found from the top-level package's location, versions from
package metadata); the first set that still holds gives the full key,
``sha256(declared key, set digest)``, under which the stage's outputs are stored. When none
holds, the stage reruns, and the reason names what changed (``model code changed
(myhelpers.py)``).
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import importlib.util
import json
import logging
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hyperexport.engine.code_closure import PACKAGE
from hyperexport.engine.environment import SITE_DIRS, distribution_version
from hyperexport.engine.hashing import (
    FileDigestIndex,
    atomic_write_json,
    canonical_json,
    sha256_text,
)

log = logging.getLogger(__name__)

DEPS_FORMAT = 1
#: Dependency sets kept per declared key (newest first); older ones are dropped.
MAX_SETS = 8
_NOT_RECORDED = frozenset((PACKAGE, "__main__", "__mp_main__"))

#: ``{"modules": {name: [relative file, digest]}, "dists": {name: version}}``.
DependencySet = dict[str, dict[str, Any]]


def _is_stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


@functools.lru_cache(maxsize=1)
def _distributions_by_top() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _path_entries() -> list[Path]:
    """The folders of ``sys.path`` (resolved), longest first."""
    entries = {Path(p or ".").resolve() for p in sys.path if isinstance(p, str)}
    return sorted((e for e in entries if e.is_dir()), key=lambda e: len(e.parts), reverse=True)


def _relative_file(name: str, file: Path, entries: list[Path]) -> str | None:
    """The file relative to the folder its top-level package sits in.

    ``a/b/c.py`` for module ``a.b.c`` at ``/x/a/b/c.py``. A module registered under a name that
    does not match its place is named relative to the ``sys.path`` folder (``entries``)
    holding it; None if there is none.
    """
    parts = name.split(".")
    depth = len(parts) if file.stem == "__init__" else len(parts) - 1
    if depth < len(file.parents):
        rel = file.relative_to(file.parents[depth])
        if rel.parts[0].split(".")[0] == parts[0]:
            return rel.as_posix()
    for entry in entries:
        if file.is_relative_to(entry):
            return file.relative_to(entry).as_posix()
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


def snapshot(index: FileDigestIndex) -> DependencySet:
    """The dependency set of this process now: every non-stdlib module in ``sys.modules``."""
    modules: dict[str, list[str]] = {}
    dists: dict[str, str | None] = {}
    owners_of: dict[str, list[str] | None] = {}
    entries = _path_entries()
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top in _NOT_RECORDED or _is_stdlib(top) or not isinstance(module, ModuleType):
            continue
        file = _module_file(module)
        if file is None or not file.is_absolute():
            # Namespace packages, modules made at run time, and submodules with a relative
            # __file__ (torch.ops): keyed through their top-level module's distribution.
            top_module = sys.modules.get(top)
            file = _module_file(top_module) if top_module is not None else None
            if file is None or not file.is_absolute():
                continue
            name = top
        site_top = _site_top(file)
        if site_top is not None:
            if site_top not in owners_of:
                owners_of[site_top] = _distributions_by_top().get(site_top) or None
            owners = owners_of[site_top]
            if owners is not None:  # an installed distribution: its version stands for its files
                dists.update((dist, distribution_version(dist)) for dist in owners)
                continue
        elif _in_stdlib(file):
            continue
        rel = _relative_file(name, file, entries)
        if rel is None:
            log.warning(
                "module %s (%s) cannot be named relative to its package; the cache keys it "
                "by its absolute path",
                name,
                file,
            )
            rel = file.as_posix()
        try:
            modules[name] = [rel, index.digest(file)]
        except OSError as e:  # deleted since it was imported: nothing to validate it against
            log.warning("module %s: cannot hash %s (%s); not recorded", name, file, e)
    return {"modules": dict(sorted(modules.items())), "dists": dict(sorted(dists.items()))}


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


def _current_file(name: str, rel: str, entries: list[Path]) -> Path | None:
    """Where recorded file ``rel`` of module ``name`` is now: under its top-level package's
    folder (editable installs map packages outside ``sys.path``), else a ``sys.path`` folder."""
    if Path(rel).is_absolute():
        return Path(rel) if Path(rel).is_file() else None
    for root in [*_package_roots(name.partition(".")[0]), *entries]:
        candidate = root / rel
        if candidate.is_file():
            return candidate
    return None


def changes(deps: DependencySet, index: FileDigestIndex) -> list[str]:
    """What no longer holds in ``deps``: ``["myhelpers.py", "numpy 1.26.4→2.0.0", ...]``.

    Files are named by their recorded relative path (``… removed`` when gone); distributions
    by name and versions. Empty when every dependency still matches.
    """
    found: list[str] = []
    entries = _path_entries()
    for name, (rel, digest) in deps.get("modules", {}).items():
        current = _current_file(name, rel, entries)
        if current is None:
            found.append(f"{rel} removed")
            continue
        try:
            now = index.digest(current)
        except OSError as e:
            log.warning("cannot hash %s: %s", current, e)
            now = None
        if now != digest:
            found.append(rel)
    for dist, version in deps.get("dists", {}).items():
        now_version = distribution_version(dist)
        if now_version != version:
            found.append(f"{dist} {version}→{now_version}")
    return found


def describe(found: list[str], limit: int = 3) -> str:
    """A rerun reason from :func:`changes`: ``model code changed (myhelpers.py)``."""
    files = [c for c in found if "→" not in c]
    dists = [c for c in found if "→" in c]
    parts = []
    if files:
        shown = ", ".join(files[:limit]) + (
            f", +{len(files) - limit} more" if len(files) > limit else ""
        )
        parts.append(f"model code changed ({shown})")
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
    """

    root: Path
    index: FileDigestIndex
    read_only: bool = False
    _memo: dict[str, list[DependencySet]] = field(default_factory=dict, repr=False)

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
            found = changes(deps, self.index)
            if not found:
                return Resolution(full_key(declared, deps))
            first_change = first_change or describe(found)
        return Resolution(None, first_change)

    def record(self, declared: str) -> str:
        """Snapshot this process's modules as a set of ``declared``; returns the full key."""
        deps = snapshot(self.index)
        if not self.read_only:
            kept = [s for s in self.sets(declared) if set_digest(s) != set_digest(deps)]
            sets = [deps, *kept][:MAX_SETS]
            atomic_write_json(self.path(declared), {"format": DEPS_FORMAT, "sets": sets})
            self._memo[declared] = sets
        return full_key(declared, deps)


def _valid_set(deps: Any) -> bool:
    if not isinstance(deps, dict):
        return False
    modules, dists = deps.get("modules"), deps.get("dists")
    if not isinstance(modules, dict) or not isinstance(dists, dict):
        return False
    return all(
        isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)
        for v in modules.values()
    ) and all(v is None or isinstance(v, str) for v in dists.values())

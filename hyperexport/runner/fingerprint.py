"""Environment and model fingerprints, computed without importing the libraries they describe.

* The environment fingerprint is the Python version and the installed versions of the libraries
  whose behaviour shapes an export (read from package metadata, never by importing them).
* The model fingerprint covers the model's *code* (installed distributions by name, version and a
  digest of their RECORD file; local, non-installed modules by a digest of their source files;
  hyperexport's own sources always) and its *weights* (the seed, or checkpoint file digests, with
  a size/mtime fast path so a no-op build does not re-hash large files).
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import importlib.util
import logging
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hyperexport.runner.hashing import FileDigestIndex, canonical_json, sha256_text

log = logging.getLogger(__name__)

ENV_DISTRIBUTIONS = (
    "torch",
    "onnx",
    "onnxscript",
    "onnx-ir",
    "onnxruntime",
    "transformers",
    "hyperexport",
)

_SITE_DIRS = ("site-packages", "dist-packages")


def environment_fingerprint() -> dict[str, Any]:
    """Python major.minor and the versions of :data:`ENV_DISTRIBUTIONS` (None if absent)."""
    versions: dict[str, str | None] = {}
    for name in ENV_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "packages": versions}


def top_level_module(import_path: str) -> str:
    """``"pkg.mod:obj"`` or ``"pkg.mod.Obj"`` -> ``"pkg"``."""
    return import_path.split(":", 1)[0].split(".", 1)[0]


@functools.lru_cache(maxsize=1)
def _packages_distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


def _distribution_of(top: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(top)
    except metadata.PackageNotFoundError:
        pass
    for name in _packages_distributions().get(top, []):
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _source_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _local_digest(root: Path, index: FileDigestIndex) -> str:
    base = root.parent if root.is_file() else root
    entries = sorted((p.relative_to(base).as_posix(), index.digest(p)) for p in _source_files(root))
    return sha256_text(canonical_json(entries))


def module_fingerprint(top: str, index: FileDigestIndex) -> dict[str, Any]:
    """Fingerprint of one top-level module or package, found without importing it.

    Args:
        top: A top-level module name (``"transformers"``, ``"my_models"``).
        index: File digest index used for local source files.

    Returns:
        ``{"kind": "dist", name, version, record}`` for an installed distribution,
        ``{"kind": "local", digest}`` for source files outside site-packages (an editable install
        counts as local), ``{"kind": "stdlib"}``, or ``{"kind": "missing"}``.
    """
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return {"kind": "stdlib"}
    spec = importlib.util.find_spec(top)
    if spec is None:
        return {"kind": "missing"}
    if spec.origin and spec.origin not in ("built-in", "frozen", "namespace"):
        origin = Path(spec.origin)
        root = origin.parent if origin.name == "__init__.py" else origin
    elif spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
    else:
        return {"kind": "missing"}
    if any(part in _SITE_DIRS for part in root.parts):
        dist = _distribution_of(top)
        if dist is not None:
            record = dist.read_text("RECORD") or ""
            return {
                "kind": "dist",
                "name": dist.metadata["Name"],
                "version": dist.version,
                "record": sha256_text(record),
            }
        log.warning("no distribution owns installed module %r; hashing its sources", top)
    return {"kind": "local", "digest": _local_digest(root, index)}


@functools.lru_cache(maxsize=1)
def _own_fingerprint() -> dict[str, Any]:
    # Hashed once per process: the hyperexport code a process runs cannot change while it runs.
    return module_fingerprint("hyperexport", FileDigestIndex(None))


def code_fingerprint(import_paths: Iterable[str], index: FileDigestIndex) -> dict[str, Any]:
    """Fingerprints of the top-level modules behind ``import_paths``, plus hyperexport's own."""
    tops = sorted({top_level_module(p) for p in import_paths} - {"hyperexport"})
    found = {top: module_fingerprint(top, index) for top in tops}
    found["hyperexport"] = _own_fingerprint()
    return dict(sorted(found.items()))


def weights_fingerprint(
    seed: Any, checkpoint: Path | None, index: FileDigestIndex
) -> dict[str, Any]:
    """The seed and, when a checkpoint is used, the digests of its file(s) (names relative)."""
    if checkpoint is None:
        return {"seed": seed, "checkpoint": None}
    files = _checkpoint_files(checkpoint)
    base = checkpoint.parent if checkpoint.is_file() else checkpoint
    digests = {p.relative_to(base).as_posix(): index.digest(p) for p in files}
    return {"seed": seed, "checkpoint": digests}


def _checkpoint_files(checkpoint: Path) -> list[Path]:
    if checkpoint.is_file():
        return [checkpoint]
    return sorted(p for p in checkpoint.rglob("*") if p.is_file())

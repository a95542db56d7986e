"""The environment a build runs in, read without importing the libraries it describes.

Python's major.minor and the installed versions of distributions, from package metadata (the
``<name>-<version>.dist-info`` folder names on ``sys.path`` first, one listing per entry).
"""

from __future__ import annotations

import functools
import importlib.metadata as metadata
import os
import re
import sys
from collections.abc import Iterable
from typing import Any

#: Folders of installed distributions: a module found under one is keyed by its version.
SITE_DIRS = frozenset(("site-packages", "dist-packages"))


def environment_fingerprint(names: Iterable[str]) -> dict[str, Any]:
    """Python major.minor and the versions of the distributions ``names`` (None if absent).

    A stage's key holds only its own :attr:`~.stage.Stage.libraries`; a build
    report may list more.
    """
    versions = {name: distribution_version(name) for name in names}
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "packages": versions}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.lru_cache(maxsize=1)
def _dist_info_versions() -> dict[str, str]:
    """``{normalized name: version}`` from the ``<name>-<version>.dist-info`` folder names on
    ``sys.path`` (first one wins, as for importlib.metadata): one directory listing per path
    entry instead of reading every distribution's METADATA."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            if folder.endswith(".dist-info"):
                name, sep, version = folder.removesuffix(".dist-info").rpartition("-")
                if sep and name and version:
                    found.setdefault(_normalized(name), version)
    return found


@functools.lru_cache(maxsize=256)
def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None (read once per process)."""
    version = _dist_info_versions().get(_normalized(name))
    if version is not None:
        return version
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

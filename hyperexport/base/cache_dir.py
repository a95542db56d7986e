"""Where hyperexport's cache lives when no build setting says: standard library only, so that the command
line can name the keyed loader's bytecode folder before it imports anything else
(``engine/keyed_imports.py``)."""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable naming the cache directory.
ENV_CACHE_DIR = "HYPEREXPORT_CACHE_DIR"


def default_cache_dir(configured: str | os.PathLike[str] | None = None) -> Path:
    """``configured``, else ``$HYPEREXPORT_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    if configured:
        return Path(configured).expanduser().resolve()
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return (base / "hyperexport").resolve()

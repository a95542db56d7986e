"""What every subcommand reports the same way: invalid arguments (exit 2) and unusable
directories (exit 3), each as one line."""

from __future__ import annotations

import os
from pathlib import Path


class UsageError(Exception):
    """Invalid command-line arguments (exit code 2, one line)."""


class UnusableDirectory(Exception):
    """The cache or outputs directory cannot be used (exit code 3, one line)."""


def check_dir(path: Path, what: str, *, writable: bool) -> None:
    """Refuse a ``what`` directory that is a file or lacks access; a missing one is fine (empty).

    Raises:
        UnusableDirectory: naming the directory and what is wrong.
    """
    if not path.exists():
        return
    if not path.is_dir():
        raise UnusableDirectory(f"{what} directory {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK) or (writable and not os.access(path, os.W_OK)):
        need = "readable and writable" if writable else "readable"
        raise UnusableDirectory(f"{what} directory {path} is not {need}")

"""The hiera classes of a capture: class objects or import paths resolved to module classes, with
clear errors (the caller's code, never data read back from disk).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from hyperexport.base.errors import (
    HieraError,
    did_you_mean,
)
from hyperexport.base.versions import missing_transformers_class


def import_hiera_class(name: str) -> Any:
    """Import ``package.module.Class`` (the caller's code, never data read back from disk)."""
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj: Any = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            qual = f"{head}.{qual}"
            continue
        for part in qual.split("."):
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def resolve_hiera(hiera: Sequence[type | str]) -> tuple[type, ...]:
    """Turn class objects or import paths into module classes, with clear errors."""
    classes = []
    for item in hiera:
        cls: Any = item
        if isinstance(item, str):
            try:
                cls = import_hiera_class(item)
            except (ImportError, AttributeError) as e:
                too_old = missing_transformers_class(item)
                if too_old:
                    raise HieraError(f"hiera class {item!r}: {too_old}") from e
                raise HieraError(
                    f"hiera class {item!r} cannot be imported: {e}{_close_match(item)}"
                ) from e
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise HieraError(f"hiera entry {item!r} is not a torch.nn.Module subclass")
        classes.append(cls)
    return tuple(classes)


def _close_match(path: str) -> str:
    """``"; did you mean 'x'?"`` for the last part of ``path`` among its module's names."""
    module, _, name = path.rpartition(".")
    try:
        owner = importlib.import_module(module) if module else None
    except ImportError:
        return ""
    return did_you_mean(name, [n for n in dir(owner) if not n.startswith("_")]) if owner else ""

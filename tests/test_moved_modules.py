"""Modules that moved in the restructuring (issue 33) still import from their old paths, with a
DeprecationWarning naming the new one, and give the new module's objects.

The errors and exit codes are what library users and scripts import, and ``api``/``options``
defined the package's public names before the library had its folder (those names are on
``hyperexport`` itself); the library's public homes (``hyperexport.zoo``, ``.compat.hyperonnx``,
...) are not deprecated and do not warn (``tests/library/test_public_homes.py``). The product's packages
(``hyperexport.config``, ``.cli``, ``.builds``, ``.stages``) get no shim: a shim at the top would
import up the layer table (tests/test_layering.py), and their users are the command line."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "hyperexport.errors": ("hyperexport.base.errors", "HieraError"),
    "hyperexport.exit_codes": ("hyperexport.base.exit_codes", "INVALID"),
    "hyperexport.api": ("hyperexport.library.api", "capture_model"),
    "hyperexport.options": ("hyperexport.library.options", "ExportOptions"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_path_warns_and_gives_the_new_objects(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    new, name = MOVED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)

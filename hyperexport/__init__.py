"""hyperexport: export PyTorch models to hierarchical ONNX.

Importing the package is cheap: torch and onnx load only when an export entry point is used, so
the build's no-op path never imports them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: The public names and the modules that define them, imported on first use: so importing the
#: package loads nothing else (the command line then loads everything through the keyed loader,
#: ``engine/keyed_imports.py``, and a no-op build never loads torch or onnx).
_PUBLIC = {
    "CheckError": "hyperexport.base.errors",
    "HieraError": "hyperexport.base.errors",
    "HyperExportError": "hyperexport.base.errors",
    "InputError": "hyperexport.base.errors",
    "ModelForwardError": "hyperexport.base.errors",
    "ModuleExportError": "hyperexport.base.errors",
    "OpsetError": "hyperexport.base.errors",
    "OptionsError": "hyperexport.base.errors",
    "RecipeError": "hyperexport.base.errors",
    "RewriteError": "hyperexport.base.errors",
    "StageError": "hyperexport.base.errors",
    "AttentionOptions": "hyperexport.library.options",
    "CustomOpSymbolic": "hyperexport.library.options",
    "ExportOptions": "hyperexport.library.options",
    "RewriteOptions": "hyperexport.library.options",
    "export_hyper_onnx": "hyperexport.library.api",
}

if TYPE_CHECKING:
    from hyperexport.base.errors import (
        CheckError,
        HieraError,
        HyperExportError,
        InputError,
        ModelForwardError,
        ModuleExportError,
        OpsetError,
        OptionsError,
        RecipeError,
        RewriteError,
        StageError,
    )
    from hyperexport.library.api import export_hyper_onnx
    from hyperexport.library.options import (
        AttentionOptions,
        CustomOpSymbolic,
        ExportOptions,
        RewriteOptions,
    )

__all__ = [
    "AttentionOptions",
    "CheckError",
    "CustomOpSymbolic",
    "ExportOptions",
    "HieraError",
    "HyperExportError",
    "InputError",
    "ModelForwardError",
    "ModuleExportError",
    "OpsetError",
    "OptionsError",
    "RecipeError",
    "RewriteError",
    "RewriteOptions",
    "StageError",
    "__version__",
    "export_hyper_onnx",
]


def lazy_attributes(module: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` that imports ``table[name]`` (the module defining ``name``) on
    first use of ``name``, and keeps the value in the module: the one lazy-import helper of the
    package's ``__init__`` files (it lives here, so using it loads no other module)."""

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__


__getattr__ = lazy_attributes(__name__, _PUBLIC)

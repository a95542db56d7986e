"""hyperexport: export PyTorch models to hierarchical ONNX.

Importing the package is cheap: torch and onnx load only when an export entry point is used, so
the build's no-op path never imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hyperexport.errors import (
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
from hyperexport.options import (
    AttentionOptions,
    CustomOpSymbolic,
    ExportOptions,
    RewriteOptions,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from hyperexport.api import export_hyper_onnx

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


def __getattr__(name: str) -> Any:
    if name == "export_hyper_onnx":
        from hyperexport.api import export_hyper_onnx

        return export_hyper_onnx
    raise AttributeError(f"module 'hyperexport' has no attribute {name!r}")

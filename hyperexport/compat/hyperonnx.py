"""``hyperexport.compat.hyperonnx``: HyperONNX's public names with its defaults.

Its public home: the code is in :mod:`hyperexport.library.compat.hyperonnx`, and this module re-
exports it (every other name of it too, read on first use). Not deprecated: ``docs/library.md``
tells HyperONNX users to switch to it (a changed import).
"""

from __future__ import annotations

from typing import Any

from hyperexport.library.compat import hyperonnx as _home
from hyperexport.library.compat.hyperonnx import (
    HYPER_DOMAIN,
    HYPERONNX_ATTN_IMPL,
    StaticCache,
    attention_interface,
    attention_translation_table,
    auto_trace_method,
    export_hyper_onnx,
    patch_transformers,
    promote_onnx_model_to_opset24,
    register_attention_opsets,
)

__all__ = [
    "HYPERONNX_ATTN_IMPL",
    "HYPER_DOMAIN",
    "StaticCache",
    "attention_interface",
    "attention_translation_table",
    "auto_trace_method",
    "export_hyper_onnx",
    "patch_transformers",
    "promote_onnx_model_to_opset24",
    "register_attention_opsets",
]


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

"""Stable, readable names for functions and call sites, derived from class and module path.

No hashes and no process-dependent counters: the same model gives the same names every time.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^0-9A-Za-z_]")


def class_short_name(class_name: str) -> str:
    """``transformers.models.llama.modeling_llama.LlamaDecoderLayer`` -> ``LlamaDecoderLayer``."""
    return class_name.rsplit(".", 1)[-1]


def instance_function_name(class_name: str, module_path: str, variant: int) -> str:
    """Per-instance function name: ``LlamaDecoderLayer_layers_0`` (``_v2`` for a 2nd signature)."""
    base = f"{class_short_name(class_name)}_{_UNSAFE.sub('_', module_path)}"
    return base if variant == 0 else f"{base}_v{variant + 1}"


def type_function_name(class_name: str, variant: int) -> str:
    """Per-type function name: ``LlamaDecoderLayer`` (``LlamaDecoderLayer_v2`` for a 2nd body)."""
    base = class_short_name(class_name)
    return base if variant == 0 else f"{base}_v{variant + 1}"


def relative_path(path: str, parent: str) -> str:
    """``layers.0.mlp`` relative to ``layers.0`` is ``mlp``; relative to the root it is itself."""
    return path[len(parent) + 1 :] if parent and path.startswith(parent + ".") else path

"""``hyperexport.zoo``: the zoo's small models, built from a seed.

Its public home: the code is in :mod:`hyperexport.library.zoo`, and this module re-exports it
(every other name of it too, read on first use). Not deprecated: recipes name its factories as
``model._target_`` (``hyperexport.zoo.tiny_llama``); the recipe validation reads their
parameters from source through this module's import.
"""

from __future__ import annotations

from typing import Any

from hyperexport.library import zoo as _home
from hyperexport.library.zoo import (
    DECODER_SHAPES,
    EXPECTED_FAILURES,
    MOE_CONFIGS,
    SEQ2SEQ_BASE,
    describe,
    expected_failures,
    forward_zoo,
    random_transformer,
    seq2seq_zoo,
    sized_decoder,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_moe,
    tiny_qwen2,
    tiny_resnet,
    tiny_vit,
)

__all__ = [
    "DECODER_SHAPES",
    "EXPECTED_FAILURES",
    "MOE_CONFIGS",
    "SEQ2SEQ_BASE",
    "describe",
    "expected_failures",
    "forward_zoo",
    "random_transformer",
    "seq2seq_zoo",
    "sized_decoder",
    "tiny_bert",
    "tiny_gpt2",
    "tiny_llama",
    "tiny_moe",
    "tiny_qwen2",
    "tiny_resnet",
    "tiny_vit",
]


def __getattr__(name: str) -> Any:
    return getattr(_home, name)

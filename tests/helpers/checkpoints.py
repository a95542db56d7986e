"""Tiny checkpoints written by the tests themselves (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_tiny_llama(folder: Path, *, tied: bool = False, seed: int = 0, **config: Any) -> Path:
    """A float32 ``LlamaForCausalLM`` with seeded random weights, saved in ``folder`` as one
    safetensors file; ``config`` overrides its sizes (vocabulary 128, hidden 64, 2 layers)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes: dict[str, Any] = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "use_cache": False,
        **config,
    }
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=tied, **sizes))  # type: ignore[call-arg]
    model.save_pretrained(folder, safe_serialization=True)
    return folder

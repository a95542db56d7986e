"""KV-cache export: past keys/values as explicit graph inputs, updated ones as outputs.

:class:`ExplicitKVCacheModel` wraps a transformers decoder (``LlamaModel``-like, or a
``...ForCausalLM``) so that its forward takes and returns plain tensors only:

    (input_ids, attention_mask, position_ids, past_key_0, past_value_0, ...)
        -> (hidden_states or logits, present_key_0, present_value_0, ...)

``past_*`` are ``(batch, kv_heads, past_len, head_dim)``; ``present_*`` have ``past_len +
new_len`` positions (the cache is updated by concatenation, as transformers' ``DynamicCache``
does). Prefill is the same graph with ``past_len = 0``. Inside a decoder-layer function the
layer's past/present become that function's inputs/outputs, so the function serves generation.

This is the concatenating (growing) cache layout that ONNX Runtime GenAI-style loops use; a
fixed-size cache updated by scatter is not implemented here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ExplicitKVCacheModel(nn.Module):
    """A transformers decoder with its KV cache as explicit tensor inputs and outputs.

    Args:
        model: A transformers decoder model (base model or causal LM).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        self.config = config
        self.num_layers = int(config.num_hidden_layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Run one step (prefill or decode) and return the output and the updated cache."""
        from transformers import DynamicCache

        if len(past) != 2 * self.num_layers:
            raise ValueError(f"expected {2 * self.num_layers} past tensors, got {len(past)}")
        cache = DynamicCache(config=self.config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        main = output.logits if hasattr(output, "logits") else output.last_hidden_state
        presents: list[torch.Tensor] = []
        layers: list[Any] = list(cache.layers)
        for layer in layers:
            presents.extend((layer.keys, layer.values))
        return (main, *presents)

    def io_names(self) -> tuple[list[str], list[str]]:
        """Input and output names for ``torch.onnx.export``."""
        pasts = [f"past_{kind}_{i}" for i in range(self.num_layers) for kind in ("key", "value")]
        presents = [p.replace("past_", "present_") for p in pasts]
        return ["input_ids", "attention_mask", "position_ids", *pasts], ["output", *presents]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """``dynamic_axes`` for the TorchScript path: batch, new length, past and total length."""
        inputs, outputs = self.io_names()
        axes: dict[str, dict[int, str]] = {
            "input_ids": {0: "batch", 1: "new_len"},
            "attention_mask": {0: "batch", 1: "total_len"},
            "position_ids": {0: "batch", 1: "new_len"},
            outputs[0]: {0: "batch", 1: "new_len"},
        }
        for name in inputs[3:]:
            axes[name] = {0: "batch", 2: "past_len"}
        for name in outputs[1:]:
            axes[name] = {0: "batch", 2: "total_len"}
        return axes

    def empty_past(self, batch: int) -> list[torch.Tensor]:
        """Zero-length past tensors for a prefill step."""
        config = self.config
        heads = int(getattr(config, "num_key_value_heads", config.num_attention_heads))
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        dtype = next(self.model.parameters()).dtype
        return [torch.zeros(batch, heads, 0, head_dim, dtype=dtype)] * (2 * self.num_layers)

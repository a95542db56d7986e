"""Small wrappers that give transformers models one tensor in and one tensor out, and small
configs of them."""

from __future__ import annotations

import torch
from torch import nn


class LastHidden(nn.Module):
    """Calls a transformers model by keyword with one tensor; returns ``last_hidden_state``."""

    def __init__(self, model: nn.Module, key: str = "input_ids") -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}).last_hidden_state


#: A Wav2Vec2/HuBERT config small enough for the default run: two encoder layers over three conv
#: layers whose strides (5, 2, 2) derive the encoder's length from the samples.
SMALL_SPEECH_CONFIG = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 37,
    "conv_dim": (16, 16, 16),
    "conv_stride": (5, 2, 2),
    "conv_kernel": (10, 3, 3),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 2,
}

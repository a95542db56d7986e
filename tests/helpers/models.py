"""Small wrappers that give transformers models one tensor in and one tensor out."""

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

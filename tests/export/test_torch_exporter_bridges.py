"""The TorchScript path's bridges to older torch releases (facts: hyperexport/versions.py):
each runs on every stack, exercising the bridge where the installed torch needs it."""

from __future__ import annotations

import torch
from torch import nn

from hyperexport.export import weights


class ScaledAttention(nn.Module):
    """SDPA with a given scale that differs from the default (transformers always gives one)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v, scale=0.3)


def test_the_installed_torch_gets_a_working_wrapper() -> None:
    tensor = torch.ones(2, 3, dtype=torch.bfloat16)
    wrapped = weights.torch_tensor(tensor, "w")
    assert wrapped.name == "w" and wrapped.tobytes() == tensor.view(torch.uint8).numpy().tobytes()

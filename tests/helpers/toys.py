"""A toy hierarchy: nested hiera modules, a module called in a loop, keywords and dict outputs."""

from __future__ import annotations

import torch
from torch import nn


class Leaf(nn.Module):
    """A hiera leaf with an optional tensor keyword and a float keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(
        self, x: torch.Tensor, gate: torch.Tensor | None = None, scale: float = 1.0
    ) -> torch.Tensor:
        y = self.proj(x) * scale
        return y if gate is None else y * torch.sigmoid(gate)


class Block(nn.Module):
    """Two levels of hiera: Block contains Leaf; returns a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Leaf()
        self.second = Leaf()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.first(x)
        h = self.second(h, scale=2.0, gate=gate)  # kwargs out of order
        return {"hidden": h, "skip": x + 1}


class Net(nn.Module):
    """``shared`` (a Leaf) called three times in a loop, then a Block, then a plain head."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.shared = Leaf()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(3):  # a module called in a loop
            x = self.shared(x)
        out = self.block(x, gate)
        return self.head(out["hidden"]), out["skip"]


def toy_net() -> Net:
    """A seeded ``Net`` in eval mode."""
    torch.manual_seed(0)
    return Net().eval()


def toy_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded ``(x, gate)`` for ``Net``."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)

"""Models for ``--model package.module:function`` in the tests (imported by the worker processes)."""

from __future__ import annotations

import torch
from torch import nn


class Tiny(nn.Module):
    """Logits from ids: an embedding, one hidden layer, a head (no attention: fast and small)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, 16)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.emb(idx))))


def tiny() -> nn.Module:
    return Tiny()


def raises() -> nn.Module:
    raise RuntimeError("no model today\nsecond line of the error")


def not_a_module() -> object:
    return {"weights": [1, 2, 3]}


def small_vocab() -> nn.Module:
    model = Tiny()
    model.head = nn.Linear(16, 100)  # 100 ids: bytes cannot be trained
    return model

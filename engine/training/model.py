"""A small character-level (byte-level) transformer: the real workload the trainer runs.

Bytes rather than a learnt vocabulary: 256 symbols are the same on every machine, so a checkpoint
trained on one Python's standard library loads on another without a vocabulary file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as _checkpoint

from hwtui.engine.training.config import VOCAB, ModelConfig

__all__ = ["VOCAB", "CharTransformer", "ModelConfig", "build_model"]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.down = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.ln2(x))))
        return out


class CharTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)
        # An integer buffer on purpose: merging must keep it an integer tensor.
        self.register_buffer("positions", torch.arange(cfg.context, dtype=torch.int64))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions: torch.Tensor = self.positions  # type: ignore[assignment]  # a registered buffer
        x = self.tok(idx) + self.pos(positions[: idx.shape[1]])
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = _checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self(x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def build_model(cfg: ModelConfig, seed: int, activation_checkpointing: bool = False) -> CharTransformer:
    """Same seed -> bit-identical initial weights on every worker (built on CPU, then moved)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return CharTransformer(cfg, activation_checkpointing)
    finally:
        torch.random.set_rng_state(gen_state)

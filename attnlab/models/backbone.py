"""The residual stack: hidden states (B, T, dim) in, hidden states out, with any sequence mixer.

    repeat n_layers:  x = x + mixer(norm(x));  x = x + mlp(norm(x))
    x = norm(x)

The mixer is softmax attention (family ``transformer``), linear attention (``linear``) or a selective SSM
(``ssm``). The backbone knows nothing of tokens or items: a head around it (the language model in lm.py, a
recommender scoring items) embeds the input, supplies positions, and scores the output, so a new head
reuses these blocks without copying them.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.attention import Attention
from attnlab.models.dropout import Dropout
from attnlab.models.layers import MLP, build_norm
from attnlab.models.linear import LinearAttention
from attnlab.models.ssm import SelectiveSSM

MIXERS = {"transformer": Attention, "linear": LinearAttention, "ssm": SelectiveSSM}


class Block(nn.Module):
    """Pre-norm residual block. The SSM block, as in Mamba, has no separate MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = build_norm(cfg)
        self.attn = MIXERS[cfg.family](cfg, layer_idx)
        self.mlp = None
        if cfg.family != "ssm":
            self.mlp_norm = build_norm(cfg)
            self.mlp = MLP(cfg)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x, positions, pos_enc, state=None):
        x = x + self.dropout(self.attn(self.attn_norm(x), positions, pos_enc, state))
        if self.mlp is None:
            return x
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.family not in MIXERS:
            raise ValueError(f"family={cfg.family!r} has no backbone mixer; choose one of: {', '.join(MIXERS)}")
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = build_norm(cfg)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, pos_enc, state=None,
                run_blocks: Callable | None = None) -> torch.Tensor:
        """x (B, T, dim), positions (T,) or (B, T) -> (B, T, dim). ``state`` is read and extended in place.

        ``run_blocks(blocks, x, positions, pos_enc, state) -> x``: runs the blocks in place of the loop here, as
        the engine's compiled decode step does (engine/fast); it computes the same function, and the model does
        not know how."""
        if run_blocks is not None:
            return self.norm(run_blocks(self.blocks, x, positions, pos_enc, state))
        for block in self.blocks:
            x = block(x, positions, pos_enc, state)
        return self.norm(x)

"""Decoder-only, pre-norm transformer: every position of a sequence is processed in one parallel pass.

    x = embed(tokens) [+ absolute positions]
    repeat n_layers:  x = x + attn(norm(x));  x = x + mlp(norm(x))
    logits = head(norm(x))

With a KV cache the same forward serves prefill (T = prompt length) and decode (T = 1).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.attention import Attention
from attnlab.models.layers import MLP, build_norm
from attnlab.models.positional import build_positional
from attnlab.models.linear import LinearAttention, new_linear_state
from attnlab.models.ssm import SelectiveSSM, new_ssm_state
from attnlab.models.state import KVCache, RollingKVCache


MIXERS = {"transformer": Attention, "linear": LinearAttention, "ssm": SelectiveSSM}


class Block(nn.Module):
    """Pre-norm residual block. The sequence mixer is softmax attention, linear attention or a selective
    SSM (family); the SSM block, as in Mamba, has no separate MLP."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = build_norm(cfg)
        self.attn = MIXERS[cfg.family](cfg, layer_idx)
        self.mlp = None
        if cfg.family != "ssm":
            self.mlp_norm = build_norm(cfg)
            self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, positions, pos_enc, cache=None):
        x = x + self.dropout(self.attn(self.attn_norm(x), positions, pos_enc, cache))
        if self.mlp is None:
            return x
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_enc = build_positional(cfg)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = build_norm(cfg)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:  # one matrix reads tokens in and scores them out (Press & Wolf 2017)
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2 * n_layers)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                if name.endswith("A_log"):
                    continue  # the SSM's decay rates keep their structured init
                scaled = name.endswith(("attn.wo.weight", "mlp.w2.weight", "attn.out_proj.weight"))
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers) if scaled else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def new_state(self, batch_size: int, max_len: int | None = None, dtype=None, device=None):
        cfg = self.cfg
        ref = self.tok_emb.weight
        if cfg.family == "linear":
            return new_linear_state(cfg, batch_size, dtype or ref.dtype, device or ref.device)
        if cfg.family == "ssm":
            return new_ssm_state(cfg, batch_size, dtype or ref.dtype, device or ref.device)
        if cfg.kernel == "sliding":  # a ring of exactly `window` positions, whatever the context
            return RollingKVCache.allocate(cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.window, cfg.head_dim,
                                           dtype=dtype or ref.dtype, device=device or ref.device)
        return KVCache.allocate(cfg.n_layers, batch_size, cfg.n_kv_heads, max_len or cfg.max_seq_len,
                                cfg.head_dim, dtype=dtype or ref.dtype, device=device or ref.device)

    def forward(self, tokens: torch.Tensor, state: KVCache | None = None, last_only: bool = False):
        """tokens (B, T) -> logits (B, T, V), or (B, 1, V) with last_only (prefill needs no more)."""
        B, T = _check_tokens(tokens)
        positions = torch.arange(T, device=tokens.device) if state is None else state.positions(T, tokens.device)
        x = self.dropout(self.pos_enc.embed(self.tok_emb(tokens), positions))  # (B, T, dim)
        for block in self.blocks:
            x = block(x, positions, self.pos_enc, state)
        if last_only:
            x = x[:, -1:]
        logits = self.head(self.norm(x))  # (B, T, V)
        if state is not None:
            state.advance(T)
        return logits, state


def _check_tokens(tokens: torch.Tensor):
    if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32):
        raise ValueError(f"tokens must be an integer tensor of shape (B, T), got {tuple(tokens.shape)} "
                         f"{tokens.dtype}")
    if tokens.shape[1] == 0:
        raise ValueError("tokens has no positions (T=0); pass at least one token")
    return tokens.shape

"""Decoder-only language model: token embedding and positions, the backbone, and the LM head.

    x = embed(tokens) [+ absolute positions];  h = backbone(x);  logits = head(h)

One forward serves training (no state), prefill (T = prompt length) and decode (T = 1); with a state whose
sequences sit at different lengths, one forward advances all of them (see state.py).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.backbone import Backbone
from attnlab.models.dropout import Dropout
from attnlab.models.linear import new_linear_state
from attnlab.models.block_pool import KV_BLOCK_SIZE, BlockPool
from attnlab.models.paged import PagedKVCache
from attnlab.models.positional import build_positional
from attnlab.models.ssm import new_ssm_state
from attnlab.models.state import KVCache, RollingKVCache, State


def check_tokens(tokens: torch.Tensor) -> tuple[int, int]:
    """-> (B, T); a clear error for anything that is not integer ids of shape (B, T) with T >= 1."""
    if tokens.dim() != 2 or tokens.dtype not in (torch.long, torch.int32):
        raise ValueError(f"tokens must be an integer tensor of shape (B, T), got {tuple(tokens.shape)} "
                         f"{tokens.dtype}")
    if tokens.shape[1] == 0:
        raise ValueError("tokens has no positions (T=0); pass at least one token")
    return tokens.shape


def last_positions(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """(B, T, dim) -> (B, 1, dim): each row's last real position."""
    if lengths is None:
        return x[:, -1:]
    idx = (lengths - 1).to(x.device)[:, None, None].expand(-1, 1, x.shape[-1])
    return x.gather(1, idx)


class LanguageModel(nn.Module):
    # Weight names before the backbone had a module of its own (checkpoints from attnlab <= 0.1).
    LEGACY_PREFIXES = (("blocks.", "backbone.blocks."), ("norm.", "backbone.norm."))

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_enc = build_positional(cfg)
        self.dropout = Dropout(cfg.dropout)
        self.backbone = Backbone(cfg)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()
        self.tie_weights()

    def tie_weights(self) -> None:
        """One matrix reads tokens in and scores them out (Press & Wolf 2017); again after loading weights."""
        if self.cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def rebuild_buffers(self) -> None:
        """Non-persistent buffers (RoPE frequencies, ALiBi slopes) made on the meta device: compute them."""
        fresh = build_positional(self.cfg).to(self.tok_emb.weight.device)
        if hasattr(self.pos_enc, "table"):  # learned table: keep the loaded weights
            fresh.table = self.pos_enc.table
        self.pos_enc = fresh

    @classmethod
    def upgrade_state_dict(cls, tensors: dict) -> dict:
        out = {}
        for name, t in tensors.items():
            for old, new in cls.LEGACY_PREFIXES:
                if name.startswith(old):
                    name = new + name[len(old):]
                    break
            out[name] = t
        return out

    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) everywhere, residual output projections scaled by 1/sqrt(2 * n_layers)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                if name.endswith(("A_log", "conv.weight")):
                    continue  # the SSM's decay rates keep their structured init; short convolutions, Conv1d's
                scaled = name.endswith(("attn.wo.weight", "mlp.w2.weight", "attn.out_proj.weight"))
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layers) if scaled else std)
            elif name.endswith("bias") and not name.endswith(("dt_up.bias", "gate_bias")):  # the SSM's step sizes
                # and its open output gate keep their init
                nn.init.zeros_(p)

    def new_state(self, batch_size: int, max_len: int | None = None, dtype=None, device=None,
                  paged: bool = False, pool: BlockPool | None = None, block_size: int = KV_BLOCK_SIZE) -> State:
        """A state for ``batch_size`` empty sequences: KV cache (contiguous, or ``paged`` from ``pool``), a
        sliding ring, or a fixed-size linear / SSM state."""
        cfg = self.cfg
        ref = self.tok_emb.weight
        dtype, device = dtype or ref.dtype, device or ref.device
        if cfg.family == "linear":
            return new_linear_state(cfg, batch_size, dtype, device)
        if cfg.family == "ssm":
            return new_ssm_state(cfg, batch_size, dtype, device)
        if cfg.kernel == "sliding":  # a ring of exactly `window` positions, whatever the context
            return RollingKVCache.allocate(cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.window, cfg.head_dim,
                                           dtype=dtype, device=device)
        if paged or pool is not None:
            if pool is None:
                per_seq = -(-(max_len or cfg.max_seq_len) // block_size)
                pool = self.new_pool(max(1, batch_size) * per_seq, block_size, dtype, device)
            state = PagedKVCache(pool)
            for _ in range(batch_size):
                state.add_sequence()
            return state
        return KVCache.allocate(cfg.n_layers, batch_size, cfg.n_kv_heads, max_len or cfg.max_seq_len,
                                cfg.head_dim, dtype=dtype, device=device)

    def new_pool(self, n_blocks: int, block_size: int = KV_BLOCK_SIZE, dtype=None, device=None) -> BlockPool:
        """A block pool for paged caches (``new_state(..., pool=)``); shared by every sequence it serves."""
        ref = self.tok_emb.weight
        return BlockPool(self.cfg.n_layers, n_blocks, block_size, self.cfg.n_kv_heads, self.cfg.head_dim,
                         dtype or ref.dtype, device or ref.device)

    def forward(self, tokens: torch.Tensor, state: State | None = None, last_only: bool = False,
                lengths: torch.Tensor | None = None, run_blocks: Callable | None = None):
        """tokens (B, T) -> logits (B, T, V), or (B, 1, V) at each row's last real token with last_only.

        ``lengths`` (B,): row b's first lengths[b] tokens are real, the rest filler (a ragged batch).
        ``run_blocks``: see Backbone.forward (the engine's compiled decode step)."""
        B, T = check_tokens(tokens)
        if state is None:
            if lengths is not None:
                raise ValueError("lengths needs a state: without one, pass rows of real tokens only")
            positions = torch.arange(T, device=tokens.device)
        else:
            positions = state.begin(tokens, lengths).to(tokens.device)
            lengths = state.lengths
        x = self.dropout(self.pos_enc.embed(self.tok_emb(tokens), positions))  # (B, T, dim)
        h = self.backbone(x, positions, self.pos_enc, state, run_blocks)
        if state is not None:
            state.commit()
        if last_only:
            h = last_positions(h, lengths)
        return self.head(h), state  # (B, T, V)

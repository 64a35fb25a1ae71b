"""Sequence models behind one contract: ``logits, state = model(tokens, state=None)``.

``build_model(cfg)`` picks the family; ``model.new_state(batch_size, max_len)`` makes its state.
"""
from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.models.recurrent import RecurrentLM
from attnlab.models.transformer import Transformer


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu"):
    cls = RecurrentLM if cfg.is_recurrent else Transformer
    return cls(cfg).to(device)


def count_params(model) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["build_model", "count_params", "Transformer", "RecurrentLM"]

"""Sequence models behind one contract: ``logits, state = model(tokens, state=None)``.

``FAMILIES`` maps each family name to the class that builds it; ``build_model(cfg)`` looks it up and
``model.new_state(batch_size, max_len)`` makes its state. Every model owns its weight tying
(``tie_weights``), the rebuilding of its non-persistent buffers after loading (``rebuild_buffers``) and the
renaming of older weight names (``upgrade_state_dict``).
"""
from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.models.backbone import Backbone
from attnlab.models.lm import LanguageModel
from attnlab.models.recurrent import RecurrentLM
from attnlab.models.state import State

FAMILIES: dict[str, type] = {
    "transformer": LanguageModel,  # softmax attention
    "linear": LanguageModel,  # linear attention in the same backbone
    "ssm": LanguageModel,  # selective state-space blocks in the same backbone
    "rnn": RecurrentLM,
    "lstm": RecurrentLM,
    "gru": RecurrentLM,
}

Transformer = LanguageModel  # the name the rest of the project knew it by


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu"):
    if cfg.family not in FAMILIES:
        raise ValueError(f"family={cfg.family!r} is not registered; choose one of: {', '.join(FAMILIES)}")
    return FAMILIES[cfg.family](cfg).to(device)


def count_params(model) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["FAMILIES", "Backbone", "LanguageModel", "RecurrentLM", "State", "Transformer", "build_model",
           "count_params"]

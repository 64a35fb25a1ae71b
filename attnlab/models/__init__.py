"""Sequence models behind one contract: ``logits, state = model(tokens, state=None)``.

``MODEL_CLASSES`` maps each family name (config.FAMILIES) to the class that builds it; ``build_model(cfg)`` looks it up and
``model.new_state(batch_size, max_len)`` makes its state. Every model owns its weight tying
(``tie_weights``), the rebuilding of its non-persistent buffers after loading (``rebuild_buffers``) and the
renaming of older weight names (``upgrade_state_dict``).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.backbone import Backbone
from attnlab.models.lm import LanguageModel
from attnlab.models.recurrent import RecurrentLM
from attnlab.models.state import State

MODEL_CLASSES: dict[str, type] = {
    "transformer": LanguageModel,  # softmax attention
    "linear": LanguageModel,  # linear attention in the same backbone
    "ssm": LanguageModel,  # selective state-space blocks in the same backbone
    "rnn": RecurrentLM,
    "lstm": RecurrentLM,
    "gru": RecurrentLM,
}

Transformer = LanguageModel  # the name the rest of the project knew it by


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu"):
    if cfg.family not in MODEL_CLASSES:
        raise ValueError(f"family={cfg.family!r} is not registered; choose one of: {', '.join(MODEL_CLASSES)}")
    if torch.device(device).type == "meta":
        with _no_init():
            return MODEL_CLASSES[cfg.family](cfg).to(device)
    return MODEL_CLASSES[cfg.family](cfg).to(device)


@contextlib.contextmanager
def _no_init():
    """A meta-device model is a shell for loading weights into (or for tracing shapes): drawing its random init
    is meaningless, and torch's first meta-device ``normal_`` costs ~2.5-3.5 s of one-time decomposition
    imports, most of a server's start-up. nn layers call ``nn.init.<fn>`` by attribute, so swapping the
    attributes for the duration of the build skips it (what transformers' ``no_init_weights`` does)."""
    names = ("normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_", "zeros_", "ones_", "trunc_normal_",
             "constant_", "orthogonal_")
    saved = {n: getattr(nn.init, n) for n in names}
    for n in names:
        setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


def count_params(model) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


__all__ = ["MODEL_CLASSES", "Backbone", "LanguageModel", "RecurrentLM", "State", "Transformer", "build_model",
           "count_params"]

"""Grow a trained transformer language model wider without changing what it computes (Net2WiderNet, Chen et al. 2016).

Every residual coordinate, attention head and MLP unit is copied ``factor`` times; a weight that reads copies is
divided by ``factor``, so the wide model's logits equal the narrow one's. Norms see the same mean and variance over
copied coordinates, and a head keeps its width, so its RoPE rotation and score scale are unchanged. Copies get equal
gradients and would stay equal, so ``noise`` perturbs every grown matrix to let them drift apart in training.

Why: a model whose decode streams many weights (large) that has also learned its text costs a large model's training;
a narrow model learns the same text for a fraction of it, and growing it gives the large model's weight traffic.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from attnlab.errors import ConfigError

GROWABLE_POS = ("rope", "none", "learned")  # sinusoidal tables and ALiBi slopes depend on the width or head count


def _tile(t: torch.Tensor, f: int) -> torch.Tensor:
    """A Linear's weight (out, in) with both sides copied ``f`` times, divided by the ``f`` input copies it reads;
    a vector (a bias, a norm's gain) copied ``f`` times."""
    return t.repeat(f) if t.dim() == 1 else t.repeat(f, f) / f


def grow_width(model, factor: int, noise: float = 0.0, generator: torch.Generator | None = None):
    """A new LanguageModel ``factor`` times as wide (dim, heads, key/value heads, MLP width) computing the same
    logits as ``model`` (before ``noise``: each grown matrix gets N(0, (noise * its std)^2) added)."""
    from attnlab.models import build_model

    cfg = model.cfg
    if factor < 1 or int(factor) != factor:
        raise ConfigError(f"factor={factor!r} must be a whole number >= 1")
    if cfg.family != "transformer" or cfg.pos not in GROWABLE_POS:
        raise ConfigError(f"grow_width grows transformers with pos in {GROWABLE_POS}; got family={cfg.family!r}, "
                          f"pos={cfg.pos!r}")
    f = int(factor)
    wide = replace(cfg, dim=cfg.dim * f, n_heads=cfg.n_heads * f, n_kv_heads=cfg.n_kv_heads * f,
                   head_dim=cfg.head_dim, hidden_dim=cfg.hidden_dim * f)
    out = build_model(wide, model.tok_emb.weight.device)
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    old = model.state_dict()
    new = {}
    for name, t in old.items():
        if name.endswith(("attn.wqkv.weight", "attn.wqkv.bias")):
            q, k, v = t.split((H * D, Hkv * D, Hkv * D), dim=0)  # each: heads, then head width, along dim 0
            new[name] = torch.cat([_tile(p, f) for p in (q, k, v)])  # head h' of the wide model is head h' mod H
        elif name in ("tok_emb.weight", "pos_enc.table.weight"):
            new[name] = t.repeat(1, f)  # (vocab or positions, dim): each coordinate copied
        elif name == "head.weight":
            new[name] = t.repeat(1, f) / f
        elif name.startswith("backbone.norm.") and cfg.tie_embeddings:
            new[name] = t.repeat(f) / f  # the tied head reads copies undivided: the final norm divides for it
        elif t.dim() in (1, 2):
            new[name] = _tile(t, f)  # Linears, their biases, norm gains and biases
        else:
            raise ConfigError(f"grow_width does not know how to grow {name} {tuple(t.shape)}")
    missing = set(out.state_dict()) - set(new)
    if missing:
        raise ConfigError(f"grow_width does not know how to grow {sorted(missing)}")
    if cfg.tie_embeddings:
        new["head.weight"] = new["tok_emb.weight"]  # one matrix, as in the model
    if noise:
        g = generator or torch.Generator().manual_seed(0)
        for name, t in new.items():
            if t.dim() == 2 and name != "head.weight" or (name == "head.weight" and not cfg.tie_embeddings):
                t.add_(torch.randn(t.shape, generator=g).to(t) * (noise * float(t.float().std())))
    out.load_state_dict(new)
    out.tie_weights()
    return out.train(model.training)

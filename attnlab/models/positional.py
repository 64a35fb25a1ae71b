"""Positional encodings: how a permutation-equivariant attention layer learns about order.

Three ways to inject position, each a registry entry with one small interface:
- absolute (``sinusoidal``, ``learned``): a vector added to the token embedding, ``embed(x, positions)``;
- relative by rotation (``rope``, RoFormer arXiv 2104.09864): ``rotate(q, k, positions)``;
- relative by bias (``alibi``, Press et al. 2022): per-head slopes added to the scores, ``alibi_slopes``.
``none`` leaves attention blind to order. Sinusoids, RoPE and ALiBi are computed for any position, so
only ``learned`` has a table that bounds the sequence length.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from attnlab import kernels
from attnlab.errors import ConfigError


class Positional(nn.Module):
    """No positional information (the base behaviour of every hook)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("alibi_slopes", None, persistent=False)  # set by Alibi only

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        return q, k


class Sinusoidal(Positional):
    """Vaswani et al. 2017, sec. 3.5: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(same);
    embed(x) = x * sqrt(dim) + PE, the token embedding scaled as in sec. 3.4."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(0, dim, 2).float() / dim), persistent=False)
        # Sec. 3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)". Why: our token
        # embeddings start at std 0.02 while PE has unit amplitude, so unscaled the positions drowned the
        # tokens and this baseline trained worse than no positions at all (claim 5). Scaling the output, not
        # the weights, is the same function, leaves a tied LM head and the checkpoint format untouched.
        self.scale = math.sqrt(dim)

    def embed(self, x, positions):
        angles = positions.float()[..., None] * self.inv_freq  # (T, dim/2) or (B, T, dim/2)
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., T, dim) interleaved sin, cos
        return x * self.scale + pe.to(x.dtype)


class Learned(Positional):
    """GPT-2 style: a trained table of max_seq_len vectors. It cannot represent later positions."""

    def __init__(self, dim: int, max_seq_len: int):
        super().__init__()
        self.table = nn.Embedding(max_seq_len, dim)

    def embed(self, x, positions):
        size = self.table.num_embeddings
        last = int(positions.max()) if positions.device.type != "meta" else 0  # meta: shapes only, no values
        if last >= size:
            raise ConfigError(
                f"position {last} is beyond the learned positional table's size max_seq_len={size}; "
                f"use a sequence of at most {size} tokens, a larger max_seq_len, or pos rope/alibi/sinusoidal")
        return x + self.table(positions)




def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None, seq_len: int | None = None):
    """Inverse frequencies theta^(-2i/D), i < D/2, optionally rescaled for longer contexts:

    - linear (position interpolation, arXiv 2306.15595): every frequency / factor;
    - ntk (NTK-aware, static): theta * factor^(D/(D-2));
    - dynamic (NTK, as HF transformers): theta * (factor*L/L0 - (factor-1))^(D/(D-2)) once L > L0;
    - llama3 (Meta, Llama 3.1): low frequencies / factor, high kept, the band between interpolated.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    kind = (scaling or {}).get("type")
    factor = float((scaling or {}).get("factor", 1.0))
    if kind == "ntk":
        theta = theta * factor ** (head_dim / (head_dim - 2))
    elif kind == "dynamic":
        original = int(scaling["original_max_position_embeddings"])
        length = max(seq_len or original, original)
        theta = theta * ((factor * length / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
    inv_freq = 1.0 / theta ** exponents
    if kind == "linear":
        inv_freq = inv_freq / factor
    elif kind == "llama3":
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < original / high) & ~(wavelen > original / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq


class Rope(Positional):
    """Rotary embedding, rotate-half layout (as Llama in HF transformers).

    Query/key pairs (x_i, x_{i+D/2}) rotate by angle p * theta^(-2i/D), so q.k depends on p_q - p_k only.
    ``scaling`` rescales the frequencies for contexts beyond the trained length (see rope_inv_freq).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling: dict | None = None):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, theta, scaling), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        inv_freq = self.inv_freq
        if self.scaling and self.scaling.get("type") == "dynamic":
            inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling, int(positions.max()) + 1).to(inv_freq)
        angles = positions.float()[..., None] * inv_freq  # (T, D/2) or (B, T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (..., T, D)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        if cos.dim() == 3:  # per-sequence positions (B, T, D) -> (B, 1, T, D) to broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    def rotate(self, q, k, positions):
        cos, sin = self.cos_sin(positions, q.dtype)  # broadcast over (B, H, T, D)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


class _Rotary(torch.autograd.Function):
    """The compiled rotary (kernels/rope.cpp) under autograd: its gradient is the transpose, one more pass."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return kernels.native().rope_apply(x, cos, sin, False)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return kernels.native().rope_apply(g if g.stride(-1) == 1 else g.contiguous(), cos, sin, True), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) rotated: x * cos + cat(-x[half:], x[:half]) * sin. An fp32 CPU call with one row of angles per
    position goes through attnlab's compiled pass (bit for bit this formula; five passes and their backward in torch),
    unless a dispatch-level tracer (measure.trace) must see torch's ops."""
    if (x.dtype == torch.float32 and x.device.type == cos.device.type == sin.device.type == "cpu" and x.dim() == 4
            and x.stride(-1) == 1 and cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == x.shape[-2:]
            and not (cos.requires_grad or sin.requires_grad) and _current_dispatch_mode() is None):
        mod = kernels.native()
        if mod is not None:
            cos, sin = cos.contiguous(), sin.contiguous()
            if torch.is_grad_enabled() and x.requires_grad:
                return _Rotary.apply(x, cos, sin)
            return mod.rope_apply(x, cos, sin, False)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al. 2022: geometric slopes 2^(-8/n), 2^(-16/n), ...; non-powers of two interleave two series."""
    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_heads).is_integer():
        return torch.tensor(powers(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = powers(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(powers(closest) + extra)


class Alibi(Positional):
    """Linear biases: score(i, j) += -slope_h * (i - j). No embedding; extrapolates by construction."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.alibi_slopes = alibi_slopes(n_heads)


POSITIONAL = {"none": Positional, "sinusoidal": Sinusoidal, "learned": Learned, "rope": Rope, "alibi": Alibi}


def build_positional(cfg) -> Positional:
    if cfg.pos == "sinusoidal":
        return Sinusoidal(cfg.dim)
    if cfg.pos == "learned":
        return Learned(cfg.dim, cfg.max_seq_len)
    if cfg.pos == "rope":
        return Rope(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    if cfg.pos == "alibi":
        return Alibi(cfg.n_heads)
    return Positional()

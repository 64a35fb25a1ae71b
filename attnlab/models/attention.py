"""Causal multi-head attention with grouped-query heads, and a registry of interchangeable kernels.

Every kernel has one signature (HF-transformers style: the eager reference beside the fast ones):

    kernel(q, k, v, *, q_offset, causal, alibi_slopes, scale, kv_start=None) -> out
    q (B, H, T, D); k, v (B, Hkv, S, D) with H % Hkv == 0; out (B, H, T, D)

Query i sits in slot q_offset + i and keys in slots 0..S-1, so the same kernel serves a full pass
(q_offset=0, T=S), prefill after a cached prefix, and decode (T=1). ``kv_start`` (B,) marks left
padding: sequence b's keys before slot kv_start[b] are invisible. ``naive`` materialises the T x S
score matrix and is the reference every other kernel is tested against.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

KERNELS: dict[str, Callable] = {}  # filled by register_kernel here and in flash.py / sparse.py


def register_kernel(name: str):
    def wrap(fn):
        KERNELS[name] = fn
        return fn
    return wrap


def causal_mask(T: int, S: int, q_offset: int, device) -> torch.Tensor:
    """(T, S) bool, True where key j is visible to query i: j <= q_offset + i."""
    q_pos = torch.arange(q_offset, q_offset + T, device=device)
    return torch.arange(S, device=device)[None, :] <= q_pos[:, None]


def build_mask(T: int, S: int, q_offset: int, causal: bool, kv_start, device, window: int | None = None):
    """None (everything visible), (T, S) or, with padding, (B, 1, T, S) bool; True = visible.

    A padded query slot would see no key at all (and softmax would give NaN), so each slot always sees
    itself; those rows' outputs are never used."""
    mask = causal_mask(T, S, q_offset, device) if causal else None
    if window is not None:  # sliding window: key j visible to query slot p only if j > p - window
        band = torch.arange(S, device=device)[None, :] > torch.arange(q_offset, q_offset + T, device=device)[:, None] - window
        mask = band if mask is None else mask & band
    if kv_start is None:
        return mask
    keys = torch.arange(S, device=device)
    visible = keys[None, :] >= kv_start[:, None]  # (B, S)
    own = keys[None, :] == torch.arange(q_offset, q_offset + T, device=device)[:, None]  # (T, S)
    visible = visible[:, None, None, :] | own[None, None]  # (B, 1, T, S)
    return visible if mask is None else visible & mask


def alibi_bias(slopes: torch.Tensor, T: int, S: int, q_offset: int, device) -> torch.Tensor:
    """(H, T, S) additive bias -slope_h * (i - j): linear in distance, zero on the diagonal."""
    q_pos = torch.arange(q_offset, q_offset + T, device=device)
    distance = (torch.arange(S, device=device)[None, :] - q_pos[:, None]).float()  # (T, S), <= 0 if causal
    return slopes.to(device)[:, None, None] * distance[None]


@register_kernel("naive")
def naive_attention(q, k, v, *, q_offset: int, causal: bool, alibi_slopes, scale: float, kv_start=None,
                    window: int | None = None, extra_mask=None, **_):
    """softmax(q k^T * scale + bias) v, with the T x S matrix explicit. Work O(T*S*D), memory O(T*S).

    ``window`` bands the mask (the sliding kernel's reference); ``extra_mask`` (T, S) is and-ed in
    (the block_sparse kernel's pattern)."""
    B, H, T, D = q.shape
    S = k.shape[-2]
    groups = H // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D): each kv head serves `groups` query heads
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, H, T, S)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, T, S, q_offset, q.device)
    mask = build_mask(T, S, q_offset, causal, kv_start, q.device, window)
    if extra_mask is not None:
        mask = extra_mask if mask is None else mask & extra_mask
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return probs @ v  # (B, H, T, D)


@register_kernel("sdpa")
def sdpa_attention(q, k, v, *, q_offset: int, causal: bool, alibi_slopes, scale: float, kv_start=None, **_):
    """torch.nn.functional.scaled_dot_product_attention (fused flash/memory-efficient kernels where possible)."""
    T, S = q.shape[-2], k.shape[-2]
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and T <= 16:
        # Decode-sized queries in bf16 run ~3x slower on CPU than upcasting to fp32 first (measured here:
        # 340 vs 117 us at 12 heads x 512 keys); the result is cast back.
        out = sdpa_attention(q.float(), k.float(), v.float(), q_offset=q_offset, causal=causal,
                             alibi_slopes=alibi_slopes, scale=scale, kv_start=kv_start)
        return out.to(q.dtype)
    mask, is_causal = None, False
    if alibi_slopes is not None or kv_start is not None:
        mask = build_mask(T, S, q_offset, causal, kv_start, q.device)
        if alibi_slopes is not None:
            bias = alibi_bias(alibi_slopes, T, S, q_offset, q.device).to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    elif causal and T > 1:  # T == 1 at the end of the keys sees every key: no mask needed
        if T == S and q_offset == 0:
            is_causal = True  # sdpa's own causal mask is top-left aligned: right only when T == S
        else:
            mask = causal_mask(T, S, q_offset, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    """Projections, positional rotation, KV-cache write and the chosen kernel."""

    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.kernel = KERNELS[cfg.kernel]
        self.kernel_kwargs = {"sliding": {"window": cfg.window}, "block_sparse": {"block_size": cfg.block_size}}.get(
            cfg.kernel, {})
        self.causal = cfg.causal
        self.scale = self.head_dim ** -0.5
        qkv_dim = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        self.wqkv = nn.Linear(cfg.dim, qkv_dim, bias=cfg.bias)  # one matmul for q, k and v
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.dim, bias=cfg.bias)

    def forward(self, x, positions, pos_enc, cache=None):
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.wqkv(x).split((H * D, Hkv * D, Hkv * D), dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        q, k = pos_enc.rotate(q, k, positions)
        q_offset, kv_start = 0, None
        if cache is not None:  # (B, Hkv, S, D) keys/values to attend to, and where the queries sit among them
            k, v, q_offset, kv_start = cache.attend(self.layer_idx, k, v, ordered=pos_enc.alibi_slopes is not None)
        if k.dtype != q.dtype:  # a cache kept at another dtype: attend in the wider of the two
            if k.element_size() > q.element_size():  # fp32 cache under bf16 weights: widen the T new queries,
                q = q.to(k.dtype)                     # not the whole cache, every step
            else:  # bf16 cache under fp32 weights
                k, v = k.to(q.dtype), v.to(q.dtype)
        out = self.kernel(q, k, v, q_offset=q_offset, causal=self.causal,
                          alibi_slopes=pos_enc.alibi_slopes, scale=self.scale, kv_start=kv_start,
                          **self.kernel_kwargs).to(x.dtype)
        out = out.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)
        return self.wo(out)


# The other kernels register themselves on import; importing them here keeps the registry complete.
from attnlab.models import flash as _flash  # noqa: E402,F401
from attnlab.models import sparse as _sparse  # noqa: E402,F401

"""``flash`` and ``sliding``: exact attention in tiles with an online softmax (FlashAttention, arXiv 2205.14135).

The T x S score matrix is never materialised: queries are taken Bq at a time and keys Bk at a time,
and each query row keeps a running max m, normaliser l and weighted sum acc:

    m' = max(m, rowmax(s));  l' = l*e^(m-m') + rowsum(e^(s-m'));  acc' = acc*e^(m-m') + e^(s-m') v

so memory beyond inputs and outputs is O(Bq*Bk) per head plus O(T) statistics. The backward pass
(a torch.autograd.Function) recomputes each tile's probabilities from the saved log-sum-exp, so
training memory is linear in T as well. Key tiles entirely in a query tile's future (causal) or
entirely outside its window (sliding) are skipped, which is where the sliding kernel's O(T*W) comes from.
Pure PyTorch: the tile loop is Python, the tiles are large matmuls.
"""
from __future__ import annotations

import torch

from attnlab.models.attention import alibi_bias, register_kernel

Q_TILE, K_TILE = 256, 512


def _tile_mask(q0, q1, k0, k1, q_offset, causal, window, kv_start, device):
    """(…, q1-q0, k1-k0) visibility for one tile, or None when every pair is visible."""
    qp = torch.arange(q0 + q_offset, q1 + q_offset, device=device)[:, None]
    kp = torch.arange(k0, k1, device=device)[None, :]
    mask = None
    if causal:
        mask = kp <= qp
    if window is not None:
        band = kp > qp - window
        mask = band if mask is None else mask & band
    if kv_start is not None:
        pad = (kp[None] >= kv_start[:, None, None]) | (kp[None] == qp[None])  # (B, Tq, Tk); own slot stays visible
        pad = pad[:, None, None]  # (B, 1, 1, Tq, Tk)
        mask = pad if mask is None else pad & mask
    return mask


def _key_range(q0, q1, S, q_offset, causal, window):
    """Keys any query in [q0, q1) can see: skip tiles wholly in the future or wholly out of the window."""
    hi = min(S, q1 + q_offset) if causal else S
    lo = max(0, q0 + q_offset - window + 1) if window is not None else 0
    return lo, hi


def _needs_mask(q0, q1, k0, k1, q_offset, causal, window, kv_start) -> bool:
    """Only tiles that cross the causal diagonal or the window's edge (or have padding) need a mask."""
    if kv_start is not None:
        return True
    if causal and k1 - 1 > q0 + q_offset:
        return True
    return window is not None and k0 <= q1 - 1 + q_offset - window


def _forward(q, k, v, q_offset, causal, window, slopes, scale, kv_start):
    """q (B, Hkv, G, T, D), k/v (B, Hkv, 1, S, D) -> out (B, Hkv, G, T, D), lse (B, Hkv, G, T)."""
    B, Hkv, G, T, D = q.shape
    S = k.shape[-2]
    out = torch.empty_like(q)
    lse = torch.empty(B, Hkv, G, T, dtype=torch.float32, device=q.device)
    qs = q * scale  # fold the scale in once instead of scaling every tile
    for q0 in range(0, T, Q_TILE):
        q1 = min(T, q0 + Q_TILE)
        qt = qs[..., q0:q1, :]
        m = torch.full((B, Hkv, G, q1 - q0, 1), float("-inf"), device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(B, Hkv, G, q1 - q0, D, dtype=torch.float32, device=q.device)
        lo, hi = _key_range(q0, q1, S, q_offset, causal, window)
        for k0 in range(lo - lo % K_TILE if window is not None else 0, hi, K_TILE):
            k1 = min(hi, k0 + K_TILE)
            s = (qt @ k[..., k0:k1, :].transpose(-2, -1)).float()  # (B, Hkv, G, Tq, Tk)
            if slopes is not None:
                s += alibi_bias(slopes, q1 - q0, k1 - k0, q0 + q_offset - k0, q.device).view(1, Hkv, G, q1 - q0, k1 - k0)
            if _needs_mask(q0, q1, k0, k1, q_offset, causal, window, kv_start):
                s.masked_fill_(~_tile_mask(q0, q1, k0, k1, q_offset, causal, window, kv_start, q.device), float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with nothing yet
            p = s.sub_(m_safe).exp_()  # in place: the tile's scores become its probabilities (unnormalised)
            corr = torch.exp(m - m_safe)
            l = l * corr + p.sum(-1, keepdim=True)
            acc = acc.mul_(corr).add_(p.to(v.dtype) @ v[..., k0:k1, :])
            m = m_new
        out[..., q0:q1, :] = (acc / l).to(q.dtype)
        lse[..., q0:q1] = (m + torch.log(l)).squeeze(-1)
    return out, lse


def _backward(q, k, v, out, lse, dout, q_offset, causal, window, slopes, scale, kv_start):
    """Recompute each tile's P = exp(s - lse); dV = P^T dO, dS = P (dP - rowsum(dO * O)), dQ/dK from dS."""
    B, Hkv, G, T, D = q.shape
    S = k.shape[-2]
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = torch.zeros(B, Hkv, 1, S, D, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    delta = (dout.float() * out.float()).sum(-1, keepdim=True)  # (B, Hkv, G, T, 1)
    for q0 in range(0, T, Q_TILE):
        q1 = min(T, q0 + Q_TILE)
        qt, dot = q[..., q0:q1, :].float(), dout[..., q0:q1, :].float()
        lo, hi = _key_range(q0, q1, S, q_offset, causal, window)
        for k0 in range(lo - lo % K_TILE if window is not None else 0, hi, K_TILE):
            k1 = min(hi, k0 + K_TILE)
            kt, vt = k[..., k0:k1, :].float(), v[..., k0:k1, :].float()
            s = (qt @ kt.transpose(-2, -1)) * scale
            if slopes is not None:
                s = s + alibi_bias(slopes, q1 - q0, k1 - k0, q0 + q_offset - k0, q.device).view(
                    1, Hkv, G, q1 - q0, k1 - k0)
            mask = _tile_mask(q0, q1, k0, k1, q_offset, causal, window, kv_start, q.device)
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            p = torch.exp(s - lse[..., q0:q1, None])  # (B, Hkv, G, Tq, Tk)
            dv[..., k0:k1, :] += (p.transpose(-2, -1) @ dot).sum(2, keepdim=True)
            dp = dot @ vt.transpose(-2, -1)
            ds = p * (dp - delta[..., q0:q1, :]) * scale
            dq[..., q0:q1, :] += ds @ kt
            dk[..., k0:k1, :] += (ds.transpose(-2, -1) @ qt).sum(2, keepdim=True)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_offset, causal, window, slopes, scale, kv_start):
        out, lse = _forward(q, k, v, q_offset, causal, window, slopes, scale, kv_start)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (q_offset, causal, window, slopes, scale, kv_start)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, dout, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q, k, v, *, q_offset: int, causal: bool, alibi_slopes, scale: float, kv_start=None,
                    window: int | None = None):
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    q5 = q.view(B, Hkv, G, T, D)  # query heads grouped under the kv head they share (GQA without copies)
    k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, S, D)
    slopes = alibi_slopes.to(q.device) if alibi_slopes is not None else None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out = _FlashAttention.apply(q5, k5, v5, q_offset, causal, window, slopes, scale, kv_start)
    else:
        out, _ = _forward(q5, k5, v5, q_offset, causal, window, slopes, scale, kv_start)
    return out.reshape(B, H, T, D)


@register_kernel("flash")
def flash_kernel(q, k, v, *, q_offset: int, causal: bool, alibi_slopes, scale: float, kv_start=None, **_):
    """Exact attention, tiled with an online softmax; memory O(T) beyond inputs and outputs."""
    return flash_attention(q, k, v, q_offset=q_offset, causal=causal, alibi_slopes=alibi_slopes, scale=scale,
                           kv_start=kv_start)


@register_kernel("sliding")
def sliding_kernel(q, k, v, *, q_offset: int, causal: bool, alibi_slopes, scale: float, kv_start=None,
                   window: int = 256, **_):
    """Causal sliding-window attention: query p sees keys p-W+1..p. Work O(T*W)."""
    return flash_attention(q, k, v, q_offset=q_offset, causal=True, alibi_slopes=alibi_slopes, scale=scale,
                           kv_start=kv_start, window=window)

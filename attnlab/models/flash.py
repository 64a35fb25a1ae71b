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


def _tile_mask(q0, q1, k0, k1, qp, causal, window, kv_len, device):
    """(B|1, 1, 1, q1-q0, k1-k0) visibility for one tile, or None when every pair is visible.

    qp (B|1, T) query positions; key j sits at position j; kv_len (B,) hides each row's later keys."""
    q = qp[:, q0:q1, None]  # (B|1, Tq, 1)
    kp = torch.arange(k0, k1, device=device)[None, None, :]  # (1, 1, Tk)
    mask = None
    if causal:
        mask = kp <= q
    if window is not None:
        band = kp > q - window
        mask = band if mask is None else mask & band
    if kv_len is not None:
        below = kp < kv_len[:, None, None]
        mask = below if mask is None else mask & below
    return None if mask is None else mask[:, None, None]


def _key_range(q0, q1, S, q_lo, q_hi, causal, window):
    """Keys any query in [q0, q1) can see: skip tiles wholly in the future or wholly out of the window.
    q_lo, q_hi: the smallest and largest position among those queries (over all rows)."""
    hi = min(S, q_hi + 1) if causal else S
    lo = max(0, q_lo - window + 1) if window is not None else 0
    return lo, hi


def _tile_bounds(qp, q0, q1, uniform: bool):
    """Smallest and largest query position in a tile (host ints; a uniform qp is one arange)."""
    if uniform:
        base = int(qp[0, 0])
        return base + q0, base + q1 - 1
    tile = qp[:, q0:q1]
    return int(tile.min()), int(tile.max())


def _needs_mask(q0, q1, k0, k1, q_lo, causal, window, ragged) -> bool:
    """Only tiles that cross the causal diagonal or the window's edge (or ragged rows) need a mask."""
    if ragged:
        return True
    if causal and k1 - 1 > q_lo:
        return True
    return window is not None and k0 <= q_lo + (q1 - q0) - 1 - window


def tile_forward(q, k, v, qp, causal, window, slopes, scale, kv_len):
    """q (B, Hkv, G, T, D), k/v (B, Hkv, 1, S, D) -> out (B, Hkv, G, T, D), lse (B, Hkv, G, T).

    A query that sees no key at all (possible when keys are split across calls) gets out 0 and lse -inf."""
    B, Hkv, G, T, D = q.shape
    S = k.shape[-2]
    ragged = qp.shape[0] > 1 or kv_len is not None
    out = torch.empty_like(q)
    lse = torch.empty(B, Hkv, G, T, dtype=torch.float32, device=q.device)
    qs = q * scale  # fold the scale in once instead of scaling every tile
    for q0 in range(0, T, Q_TILE):
        q1 = min(T, q0 + Q_TILE)
        q_lo, q_hi = _tile_bounds(qp, q0, q1, not ragged)
        qt = qs[..., q0:q1, :]
        m = torch.full((B, Hkv, G, q1 - q0, 1), float("-inf"), device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(B, Hkv, G, q1 - q0, D, dtype=torch.float32, device=q.device)
        lo, hi = _key_range(q0, q1, S, q_lo, q_hi, causal, window)
        for k0 in range(lo - lo % K_TILE if window is not None else 0, hi, K_TILE):
            k1 = min(hi, k0 + K_TILE)
            s = (qt @ k[..., k0:k1, :].transpose(-2, -1)).float()  # (B, Hkv, G, Tq, Tk)
            if slopes is not None:
                s += alibi_bias(slopes, q1 - q0, k1 - k0, qp[:, q0:q1] - k0, q.device).view(
                    -1, Hkv, G, q1 - q0, k1 - k0)
            if _needs_mask(q0, q1, k0, k1, q_lo, causal, window, ragged):
                mask = _tile_mask(q0, q1, k0, k1, qp, causal, window, kv_len, q.device)
                if mask is not None:
                    s.masked_fill_(~mask, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with nothing yet
            p = s.sub_(m_safe).exp_()  # in place: the tile's scores become its probabilities (unnormalised)
            corr = torch.exp(m - m_safe)
            l = l * corr + p.sum(-1, keepdim=True)
            acc = acc.mul_(corr).add_(p.to(v.dtype) @ v[..., k0:k1, :])
            m = m_new
        empty = l == 0
        out[..., q0:q1, :] = (acc / torch.where(empty, torch.ones_like(l), l)).to(q.dtype)
        lse[..., q0:q1] = torch.where(empty, torch.full_like(m, float("-inf")), m + torch.log(l)).squeeze(-1)
    return out, lse


def tile_backward(q, k, v, out, lse, dout, qp, causal, window, slopes, scale, kv_len):
    """Recompute each tile's P = exp(s - lse); dV = P^T dO, dS = P (dP - rowsum(dO * O)), dQ/dK from dS."""
    B, Hkv, G, T, D = q.shape
    S = k.shape[-2]
    ragged = qp.shape[0] > 1 or kv_len is not None
    dq = torch.zeros_like(q, dtype=torch.float32)
    dk = torch.zeros(B, Hkv, 1, S, D, dtype=torch.float32, device=q.device)
    dv = torch.zeros_like(dk)
    delta = (dout.float() * out.float()).sum(-1, keepdim=True)  # (B, Hkv, G, T, 1)
    lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows that saw nothing: p = 0 below
    for q0 in range(0, T, Q_TILE):
        q1 = min(T, q0 + Q_TILE)
        q_lo, q_hi = _tile_bounds(qp, q0, q1, not ragged)
        qt, dot = q[..., q0:q1, :].float(), dout[..., q0:q1, :].float()
        lo, hi = _key_range(q0, q1, S, q_lo, q_hi, causal, window)
        for k0 in range(lo - lo % K_TILE if window is not None else 0, hi, K_TILE):
            k1 = min(hi, k0 + K_TILE)
            kt, vt = k[..., k0:k1, :].float(), v[..., k0:k1, :].float()
            s = (qt @ kt.transpose(-2, -1)) * scale
            if slopes is not None:
                s = s + alibi_bias(slopes, q1 - q0, k1 - k0, qp[:, q0:q1] - k0, q.device).view(
                    -1, Hkv, G, q1 - q0, k1 - k0)
            mask = _tile_mask(q0, q1, k0, k1, qp, causal, window, kv_len, q.device)
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
    def forward(ctx, q, k, v, qp, causal, window, slopes, scale, kv_len):
        out, lse = tile_forward(q, k, v, qp, causal, window, slopes, scale, kv_len)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (qp, causal, window, slopes, scale, kv_len)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = tile_backward(q, k, v, out, lse, dout, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None,
                    window: int | None = None, return_lse: bool = False):
    """Exact attention in tiles. With ``return_lse`` also the log-sum-exp of each query's scores (B, H, T),
    so results over separate key blocks can be merged exactly (``merge_attention``)."""
    B, H, T, D = q.shape
    S, Hkv = k.shape[-2], k.shape[1]
    G = H // Hkv
    q5 = q.view(B, Hkv, G, T, D)  # query heads grouped under the kv head they share (GQA without copies)
    k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, S, D)
    slopes = alibi_slopes.to(q.device) if alibi_slopes is not None else None
    qp = torch.arange(S - T, S, device=q.device)[None] if q_pos is None else q_pos.to(q.device)  # (B|1, T)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _FlashAttention.apply(q5, k5, v5, qp, causal, window, slopes, scale, kv_len)
    else:
        out, lse = tile_forward(q5, k5, v5, qp, causal, window, slopes, scale, kv_len)
    out = out.reshape(B, H, T, D)
    return (out, lse.reshape(B, H, T)) if return_lse else out


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Combine attention over two disjoint key sets: each part weighted by its share of the softmax mass.

    out = out_a * e^(lse_a - lse) + out_b * e^(lse_b - lse), lse = log(e^lse_a + e^lse_b). Exact; a part
    whose lse is -inf (it saw no key) contributes nothing."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    wa, wb = torch.exp(lse_a - safe)[..., None], torch.exp(lse_b - safe)[..., None]
    return (out_a.float() * wa + out_b.float() * wb).to(out_a.dtype), lse


@register_kernel("flash")
def flash_kernel(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None, **_):
    """Exact attention, tiled with an online softmax; memory O(T) beyond inputs and outputs."""
    return flash_attention(q, k, v, causal=causal, alibi_slopes=alibi_slopes, scale=scale, q_pos=q_pos,
                           kv_len=kv_len)


@register_kernel("sliding")
def sliding_kernel(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None,
                   window: int = 256, **_):
    """Causal sliding-window attention: query p sees keys p-W+1..p. Work O(T*W)."""
    return flash_attention(q, k, v, causal=True, alibi_slopes=alibi_slopes, scale=scale, q_pos=q_pos,
                           kv_len=kv_len, window=window)

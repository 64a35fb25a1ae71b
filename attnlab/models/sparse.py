"""``block_sparse``: the Sparse Transformer's fixed pattern (Child et al. 2019, arXiv 1904.10509).

With block size b, query i attends
  - locally: every earlier key in its own block, floor(j/b) == floor(i/b), j <= i;
  - by stride: the last key of every earlier block ("summary" columns), j % b == b-1, j < block start.
Each query scores at most b + T/b keys, so with b ~ sqrt(T) the work is O(T*sqrt(T)) rather than T^2.
The full-sequence path computes exactly those pairs: a block-diagonal part (T/b blocks of b x b) and a
strided part (T x T/b), normalised together in one softmax. Other calls (decode, chunks after a cache,
ALiBi or padding) build the same pattern as a mask over their T x S rectangle.
"""
from __future__ import annotations

import math
import warnings

import torch

from attnlab.models.attention import naive_attention, query_positions, register_kernel

_warned = set()


def pattern_mask(T: int, S: int, q_pos, block: int, device) -> torch.Tensor:
    """(T, S) or (B, 1, T, S) bool: the fixed local + strided pattern for the queries (positions q_pos, or
    the last T of S keys) and keys 0..S-1."""
    qp = query_positions(T, S, q_pos, device)[:, :, None]  # (B|1, T, 1)
    kp = torch.arange(S, device=device)[None, None, :]
    local = (kp // block == qp // block) & (kp <= qp)
    summary = (kp % block == block - 1) & (kp < (qp // block) * block)
    mask = local | summary  # (B|1, T, S)
    return mask[0] if mask.shape[0] == 1 else mask[:, None]


def pairs_scored(T: int, block: int) -> int:
    """Number of (query, key) pairs the pattern scores over a causal sequence of T tokens."""
    total = 0
    for i in range(T):
        start = (i // block) * block
        total += (i - start + 1) + start // block
    return total


def default_block(T: int) -> int:
    return max(1, math.isqrt(max(T, 1)))


@register_kernel("block_sparse")
def block_sparse_kernel(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None,
                        block_size: int = 0, **_):
    T, S = q.shape[-2], k.shape[-2]
    block = block_size or default_block(S)
    if T == S and q_pos is None and kv_len is None and alibi_slopes is None and T > block:
        pad = -T % block  # pad to whole blocks at the end: causally invisible to every real query
        if pad:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        return _blocked(q, k, v, block, scale)[:, :, :T]
    if T > 64 and "mask" not in _warned:  # correct but quadratic: say so once
        _warned.add("mask")
        warnings.warn("block_sparse: this call (ALiBi, a ragged batch or a cached prefix) "
                      "uses the masked T x S path", stacklevel=3)
    mask = pattern_mask(T, S, q_pos, block, q.device)
    return naive_attention(q, k, v, causal=False, alibi_slopes=alibi_slopes, scale=scale, q_pos=q_pos,
                           kv_len=kv_len, extra_mask=mask)


def _blocked(q, k, v, b: int, scale: float):
    B, H, T, D = q.shape
    G = H // k.shape[1]
    k = k.repeat_interleave(G, dim=1)  # (B, H, T, D)
    v = v.repeat_interleave(G, dim=1)
    n = T // b
    qb, kb, vb = (t.view(B, H, n, b, D) for t in (q, k, v))  # (B, H, n blocks, b, D)
    local = (qb @ kb.transpose(-2, -1)).float() * scale  # (B, H, n, b, b)
    tri = torch.ones(b, b, dtype=torch.bool, device=q.device).tril()
    local = local.masked_fill(~tri, float("-inf"))
    ks, vs = kb[:, :, :, -1], vb[:, :, :, -1]  # summary keys: each block's last, (B, H, n, D)
    strided = (qb @ ks[:, :, None].transpose(-2, -1)).float() * scale  # (B, H, n, b, n)
    earlier = torch.arange(n, device=q.device)[None, :] < torch.arange(n, device=q.device)[:, None]  # (n, n)
    strided = strided.masked_fill(~earlier[None, None, :, None, :], float("-inf"))
    probs = torch.softmax(torch.cat([local, strided], dim=-1), dim=-1).to(v.dtype)  # one softmax over both
    out = probs[..., :b] @ vb + probs[..., b:] @ vs[:, :, None]  # (B, H, n, b, D)
    return out.reshape(B, H, T, D)

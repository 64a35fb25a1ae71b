"""Family ``linear``: causal linear attention (Katharopoulos et al. 2020, arXiv 2006.16236).

softmax(q k^T) is replaced by a feature map phi(x) = elu(x) + 1, so causal attention becomes

    out_t = phi(q_t)^T S_t / (phi(q_t)^T z_t),   S_t = sum_{j<=t} phi(k_j) v_j^T,   z_t = sum_{j<=t} phi(k_j)

- parallel (chunked) form, for training and prefill: within a chunk of C tokens a masked C x C product;
  across chunks the running (S, z) come from one cumulative sum over chunk summaries. Work O(T*C*D + T*D^2).
- recurrent form, for decode: the fixed-size state (S, z) per head is updated once per token.
Both forms are tested to agree. The state's bytes do not depend on the context length.

q, k and v first pass a short causal convolution (``short_conv`` wide, then SiLU; short_conv.py), as in
Based and the Zoology baselines: it lets a token's key carry the token before it, which is how a fixed state
binds a key to its value. Its last inputs are part of the state.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.models.short_conv import ShortConv
from attnlab.models.fixed_state import FixedState


def phi(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x) + 1


class LinearState(FixedState):
    """S (L, B, H, D, D): running sum of phi(k) v^T; z (L, B, H, D): running sum of phi(k); conv
    (L, B, short_conv - 1, 3 H D): the last inputs of the short convolution (absent without one)."""


def linear_parallel(q, k, v, S0, z0, chunk: int, eps: float = 1e-6):
    """q, k (phi already applied), v: (B, H, T, D); S0 (B, H, D, D), z0 (B, H, D) -> out, S_T, z_T."""
    B, H, T, D = q.shape
    pad = -T % chunk
    if pad:  # zero keys/values add nothing to the sums
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    n = (T + pad) // chunk
    qc, kc, vc = (t.reshape(B, H, n, chunk, -1) for t in (q, k, v))  # (B, H, n, C, D)
    kv = kc.transpose(-2, -1) @ vc  # (B, H, n, D, D): each chunk's summary
    ksum = kc.sum(3)  # (B, H, n, D)
    S_before = torch.cumsum(kv, dim=2) - kv + S0[:, :, None]  # exclusive prefix: state entering each chunk
    z_before = torch.cumsum(ksum, dim=2) - ksum + z0[:, :, None]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    A = (qc @ kc.transpose(-2, -1)).masked_fill(~causal, 0.0)  # (B, H, n, C, C)
    num = qc @ S_before + A @ vc
    den = (qc * z_before[:, :, :, None]).sum(-1) + A.sum(-1)
    out = (num / (den[..., None] + eps)).reshape(B, H, n * chunk, D)[:, :, :T]
    return out, S_before[:, :, -1] + kv[:, :, -1], z_before[:, :, -1] + ksum[:, :, -1]


def linear_recurrent(q, k, v, S, z, eps: float = 1e-6):
    """The same computation one token at a time: the fixed-size state is all that is carried."""
    outs = []
    for t in range(q.shape[2]):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, D, D)
        z = z + k[:, :, t]
        num = (q[:, :, t, :, None] * S).sum(-2)  # (B, H, D)
        den = (q[:, :, t] * z).sum(-1, keepdim=True)
        outs.append(num / (den + eps))
    return torch.stack(outs, dim=2), S, z


class LinearAttention(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx, self.n_heads, self.head_dim, self.chunk = layer_idx, cfg.n_heads, cfg.head_dim, cfg.chunk_size
        self.wqkv = nn.Linear(cfg.dim, 3 * cfg.n_heads * cfg.head_dim, bias=cfg.bias or cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=cfg.bias)
        self.conv = ShortConv(3 * cfg.n_heads * cfg.head_dim, cfg.short_conv) if cfg.short_conv else None

    def forward(self, x, positions, pos_enc, state=None, force: str | None = None):
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        qkv = self.wqkv(x)  # (B, T, 3 H D)
        if self.conv is not None:
            qkv = self.conv.mix(qkv, state, self.layer_idx)
        q, k, v = qkv.view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # each (B, H, T, D)
        q, k = phi(q), phi(k)
        live = None if state is None else state.valid_mask(x.device)
        if live is not None:  # filler beyond a row's length must not enter the sums
            k = k * live[:, None, :, None]
            v = v * live[:, None, :, None]
        if state is None:
            S0 = q.new_zeros(B, H, D, D)
            z0 = q.new_zeros(B, H, D)
        else:
            S0, z0 = state.S[self.layer_idx], state.z[self.layer_idx]
        recurrent = force == "recurrent" or (force is None and T == 1)
        if recurrent:
            out, S, z = linear_recurrent(q, k, v, S0, z0)
        else:
            out, S, z = linear_parallel(q, k, v, S0, z0, self.chunk)
        if state is not None:
            state.S[self.layer_idx].copy_(S)
            state.z[self.layer_idx].copy_(z)
        return self.wo(out.transpose(1, 2).reshape(B, T, H * D))  # (B, T, dim)


def new_linear_state(cfg, batch_size: int, dtype, device) -> LinearState:
    L, H, D = cfg.n_layers, cfg.n_heads, cfg.head_dim
    tensors = {"S": torch.zeros(L, batch_size, H, D, D, dtype=dtype, device=device),
               "z": torch.zeros(L, batch_size, H, D, dtype=dtype, device=device)}
    if cfg.short_conv:
        tensors["conv"] = torch.zeros(L, batch_size, cfg.short_conv - 1, 3 * H * D, dtype=dtype, device=device)
    return LinearState(tensors)

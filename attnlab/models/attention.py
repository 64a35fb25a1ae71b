"""Causal multi-head attention with grouped-query heads, and a registry of interchangeable kernels.

Every kernel has one signature (HF-transformers style: the eager reference beside the fast ones):

    kernel(q, k, v, *, causal, alibi_slopes, scale, q_pos=None, kv_len=None) -> out
    q (B, H, T, D); k, v (B, Hkv, S, D) with H % Hkv == 0; out (B, H, T, D)

Key j sits at position j. ``q_pos`` (B, T) gives each query's position, per row: sequences of a ragged
batch sit at different lengths; None means the queries are the last T of the S keys (a full pass, or a
cache whose rows all sit at one position). ``kv_len`` (B,) hides row b's keys from slot kv_len[b] on (a
shorter row's unused slots). Query (b, i) sees key j iff j < kv_len[b] and, if causal, j <= q_pos[b, i].
``naive`` materialises the T x S score matrix and is the reference every other kernel is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from attnlab import kernels
from attnlab.kernels import paths

KERNELS: dict[str, Callable] = {}  # filled by register_kernel here and in flash.py / sparse.py


def register_kernel(name: str):
    def wrap(fn):
        KERNELS[name] = fn
        return fn
    return wrap


def query_positions(T: int, S: int, q_pos, device) -> torch.Tensor:
    """(B or 1, T) positions of the queries: q_pos, or the last T of S keys."""
    return torch.arange(S - T, S, device=device)[None] if q_pos is None else q_pos


def build_mask(T: int, S: int, causal: bool, q_pos=None, kv_len=None, device=None, window: int | None = None):
    """None (everything visible), (T, S) or, per row, (B, 1, T, S) bool; True = visible."""
    if not causal and window is None and kv_len is None:
        return None
    qp = query_positions(T, S, q_pos, device)[:, :, None]  # (B|1, T, 1)
    kp = torch.arange(S, device=device)[None, None, :]  # (1, 1, S)
    mask = (kp <= qp) if causal else None
    if window is not None:  # sliding window: key j visible to a query at p only if j > p - window
        mask = (kp > qp - window) if mask is None else mask & (kp > qp - window)
    if kv_len is not None:
        below = kp < kv_len[:, None, None]  # (B, 1, S)
        mask = below if mask is None else mask & below
    mask = mask.expand(mask.shape[0], T, S)
    return mask[0] if mask.shape[0] == 1 and kv_len is None else mask[:, None]


def alibi_bias(slopes: torch.Tensor, T: int, S: int, q_pos, device) -> torch.Tensor:
    """(B|1, H, T, S) additive bias -slope_h * (i - j): linear in distance, zero on the diagonal."""
    qp = query_positions(T, S, q_pos, device)
    distance = (torch.arange(S, device=device)[None, None, :] - qp[:, :, None]).float()  # (B|1, T, S)
    return slopes.to(device)[None, :, None, None] * distance[:, None]


@register_kernel("naive")
def naive_attention(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None,
                    window: int | None = None, extra_mask=None, **_):
    """softmax(q k^T * scale + bias) v, with the T x S matrix explicit. Work O(T*S*D), memory O(T*S).

    ``window`` bands the mask (the sliding kernel's reference); ``extra_mask`` (T, S) or (B, 1, T, S) is
    and-ed in (the block_sparse kernel's pattern)."""
    B, H, T, D = q.shape
    S = k.shape[-2]
    groups = H // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D): each kv head serves `groups` query heads
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, H, T, S)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, T, S, q_pos, q.device)
    mask = build_mask(T, S, causal, q_pos, kv_len, q.device, window)
    if extra_mask is not None:
        mask = extra_mask if mask is None else mask & extra_mask
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(v.dtype)  # a row that sees no key gives 0
    return probs @ v  # (B, H, T, D)


def compiled_prefill(q, k, v, scale: float, widen: bool = False):
    """Causal attention of the last T of S keys' queries (T > 1: a prefill, a chunk of one, a verification) on
    attnlab's compiled kernel (kernels/prefill_attention.cpp): fp32 on a CPU, outside autograd and dispatch-level
    tracers (measure.trace counts torch's ops), head sizes of 1 to 8 vectors; faster than torch's flash kernel on
    the CPU (docs/engine.md). It writes (B, T, H, D), returned as a (B, H, T, D) view, so merging the heads
    afterwards is free. ``widen``: bf16 or fp16 q, k, v are widened to fp32 for the kernel and the output narrowed
    back (faster than torch's bf16 kernel, and one rounding fewer). None where it does not apply."""
    dtype = q.dtype
    narrow = widen and dtype in (torch.bfloat16, torch.float16)
    if (q.device.type != "cpu" or not q.dtype == k.dtype == v.dtype or (q.dtype != torch.float32 and not narrow)
            or q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or q.shape[0] != k.shape[0] or q.shape[-2] > k.shape[-2]
            or not q.shape[-1] or q.shape[-1] != k.shape[-1] or not k.shape[1] or q.shape[1] % k.shape[1]
            or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            or _current_dispatch_mode() is not None):
        return None
    mod = kernels.native()
    if mod is None:
        paths.fell_back("prefill_attention", "no compiled kernels here")
        return None
    if q.shape[-1] % mod.lanes() or q.shape[-1] // mod.lanes() > 8:
        paths.fell_back("prefill_attention", f"head_dim {q.shape[-1]} is not 1 to 8 vectors of {mod.lanes()}")
        return None
    if narrow:
        # .float() keeps a dense tensor's strides (a view of the fused projection that is not dense is copied
        # contiguous), so each widened copy is in a layout the checks below read, as its narrow original was
        q, k, v = q.float(), k.float(), v.float()
    if k.stride(-2) != v.stride(-2):
        # RoPE writes the rotated keys to fresh (B, S, Hkv, D) memory while v is still a view of the fused
        # projection; copying v into that layout (k is in it already: no copy) costs less than torch's kernel saves
        # (docs/engine.md).
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))  # (B, Hkv, S, D), rows Hkv*D apart
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or k.stride(-2) != v.stride(-2):
        paths.fell_back("prefill_attention", "q, k, v in a layout it does not read")
        return None
    paths.ran("prefill_attention")
    out = mod.prefill_attention(q, k, v, scale).transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D)
    return out.to(dtype)  # no copy in fp32; narrowed in its (B, T, H, D) memory otherwise


@register_kernel("sdpa")
def sdpa_attention(q, k, v, *, causal: bool, alibi_slopes, scale: float, q_pos=None, kv_len=None, **_):
    """torch.nn.functional.scaled_dot_product_attention (fused flash/memory-efficient kernels where possible); a
    causal prefill on a CPU outside autograd runs attnlab's compiled kernel instead (compiled_prefill; bf16 and fp16
    widened to fp32 for it)."""
    T, S = q.shape[-2], k.shape[-2]
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and T <= 16:
        # Decode-sized queries in bf16 run several times slower on a CPU than upcast to fp32 first (torch's bf16
        # attention kernel is not written for a few rows; docs/engine.md); the result is cast back.
        out = sdpa_attention(q.float(), k.float(), v.float(), causal=causal, alibi_slopes=alibi_slopes, scale=scale,
                             q_pos=q_pos, kv_len=kv_len)
        return out.to(q.dtype)
    if causal and alibi_slopes is None and q_pos is None and kv_len is None and T > 1:
        out = compiled_prefill(q, k, v, scale, widen=True)
        if out is not None:
            return out
    mask, is_causal = None, False
    if alibi_slopes is not None or q_pos is not None or kv_len is not None:
        mask = build_mask(T, S, causal, q_pos, kv_len, q.device)
        if alibi_slopes is not None:
            bias = alibi_bias(alibi_slopes, T, S, q_pos, q.device).to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    elif causal and T > 1:  # T == 1 at the end of the keys sees every key: no mask needed
        if T == S:
            is_causal = True  # sdpa's own causal mask is top-left aligned: right only when T == S
        else:
            mask = build_mask(T, S, True, None, None, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


@dataclass(frozen=True)
class Attend:
    """A layer's attention as a state calls it: ``attend(q, k, v, q_pos=, kv_len=)`` runs the layer's kernel, and
    the fields say what else the state may do in its place.

    ``ordered``: the kernel needs the keys in position order (ALiBi's bias is a function of distance), so a ring
    cache must unroll its ring before a decode step. ``decode_scale``: the softmax scale where a cache may answer a
    decode step (one query per row) with attnlab's fused decode kernel (cache_attention.fused_decode), which
    computes exactly sdpa without a bias; None for a kernel under study or ALiBi, which always run themselves."""

    fn: Callable
    ordered: bool = False
    decode_scale: float | None = None

    def __call__(self, q, k, v, q_pos=None, kv_len=None):
        return self.fn(q, k, v, q_pos, kv_len)


class Attention(nn.Module):
    """Projections, positional rotation, the state's key/value store and the chosen kernel."""

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
        self.wqkv = nn.Linear(cfg.dim, qkv_dim, bias=cfg.bias or cfg.qkv_bias)  # one matmul for q, k and v
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.dim, bias=cfg.bias)

    def forward(self, x, positions, pos_enc, state=None):
        out = self.mix(self.wqkv(x), positions, pos_enc, state)
        return self.wo(out.to(x.dtype))

    def mix(self, qkv, positions, pos_enc, state=None):
        """The projected q, k, v (B, T, (H + 2 Hkv) D) -> attention's output (B, T, H*D), before the output
        projection, in the kernel's dtype. Split from forward for the engine's compiled decode step
        (engine/fast/block_step.py), which projects in and out itself and leaves the attention, and its cache, to this."""
        B, T, _ = qkv.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = qkv.split((H * D, Hkv * D, Hkv * D), dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        q, k = pos_enc.rotate(q, k, positions)
        slopes = pos_enc.alibi_slopes

        def run(q, k, v, q_pos=None, kv_len=None):
            if k.dtype != q.dtype:  # a cache kept at another dtype: attend in the wider of the two
                if k.element_size() > q.element_size():  # fp32 cache under bf16 weights: widen the T new
                    q = q.to(k.dtype)                     # queries, not the whole cache, every step
                else:  # bf16 cache under fp32 weights
                    k, v = k.to(q.dtype), v.to(q.dtype)
            return self.kernel(q, k, v, causal=self.causal, alibi_slopes=slopes, scale=self.scale, q_pos=q_pos,
                               kv_len=kv_len, **self.kernel_kwargs)

        if state is None:
            out = run(q, k, v)
        else:
            attend = Attend(run, ordered=slopes is not None,
                            decode_scale=self.scale if self.kernel is sdpa_attention and slopes is None else None)
            out = state.attention(self.layer_idx, q, k, v, attend)
        return out.transpose(1, 2).reshape(B, T, H * D)  # (B, T, H*D)


# The other kernels register themselves on import; importing them here keeps the registry complete.
from attnlab.models import flash as _flash  # noqa: E402,F401
from attnlab.models import sparse as _sparse  # noqa: E402,F401

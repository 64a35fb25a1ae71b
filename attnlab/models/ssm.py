"""Family ``ssm``: a selective diagonal state-space block (Mamba style, Gu & Dao 2023, arXiv 2312.00752).

Per channel e and state index n, with input-dependent step Delta_t, B_t, C_t:

    h_t = exp(Delta_t * A) * h_{t-1} + Delta_t * B_t * u_t,     y_t = C_t . h_t + D * u_t

The recurrence h_t = a_t h_{t-1} + b_t is linear, so it can be computed two ways that agree:
- ``sequential``: a loop over T dependent steps (depth grows like T);
- ``parallel``: a Hillis-Steele scan over the associative pairs (a, b) o (a', b') = (a a', a' b + b'),
  log2(T) rounds of elementwise work over the whole sequence (depth grows like log T, work T log T).
Decode carries h (fixed size) from token to token, and the short convolution's last inputs: as in Mamba,
u passes a causal depthwise convolution (``short_conv`` wide, then SiLU; short_conv.py) before Delta, B and C
are read from it, so the state can bind a token to the one before it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.models.short_conv import ShortConv
from attnlab.models.ssm_loop import sequential_scan
from attnlab.models.fixed_state import FixedState


DT_RANGE = (1e-3, 1e-1)  # the initial step sizes Delta (Gu & Dao 2023, section 3.6 / their reference code)


class SSMState(FixedState):
    """h (L, B, E, N): each layer's state; conv (L, B, short_conv - 1, E): the short convolution's last inputs
    (absent without one). The same bytes at any context length."""


def scan_sequential(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor):
    """a, b (B, T, E, N); h0 (B, E, N) -> all h_t (B, T, E, N). T dependent steps."""
    hs, h = [], h0
    # unbind, not a[:, t]: each indexed read's backward writes a full (B, T, E, N) zero tensor (T^2 work in
    # training, 1 s a step at T=40); unbind's backward stacks the T gradients once.
    for a_t, b_t in zip(a.unbind(1), b.unbind(1)):
        h = a_t * h + b_t
        hs.append(h)
    return torch.stack(hs, dim=1)


def scan_parallel(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor):
    """Hillis-Steele inclusive scan: after the round with offset s, position t holds the composition of
    steps t-2s+1..t. ceil(log2 T) rounds; h0 is folded into the first step."""
    b = torch.cat([a[:, :1] * h0[:, None] + b[:, :1], b[:, 1:]], dim=1)
    T, offset = a.shape[1], 1
    while offset < T:
        a_prev = F.pad(a[:, :-offset], (0, 0, 0, 0, offset, 0), value=1.0)  # identity (1, 0) before the start
        b_prev = F.pad(b[:, :-offset], (0, 0, 0, 0, offset, 0), value=0.0)
        b = a * b_prev + b
        a = a * a_prev
        offset *= 2
    return b


def selective_scan(u, delta, A, Bt, Ct, D, h0, mode: str = "parallel", chunk: int | None = None):
    """u, delta (B, T, E); A (E, N); Bt, Ct (B, T, N); D (E,); h0 (B, E, N) -> y (B, T, E), h_T.

    ``chunk`` bounds memory: the (B, T, E, N) discretised tensors are formed one chunk at a time and the
    state is carried between chunks (work stays linear in T, the scan is parallel within a chunk). The
    sequential mode never forms them, so it ignores ``chunk``."""
    if mode == "sequential":  # one loop with its own backward, no (B, T, E, N) tensors (see ssm_loop.py)
        y, h = sequential_scan(u, delta, A, Bt, Ct, h0)
        return y + D * u, h
    T = u.shape[1]
    step = chunk or T
    ys, h = [], h0
    for t0 in range(0, T, step):
        sl = slice(t0, min(T, t0 + step))
        a = torch.exp(delta[:, sl, :, None] * A)  # (B, t, E, N)
        b = (delta[:, sl] * u[:, sl])[..., None] * Bt[:, sl, None, :]
        hs = scan_parallel(a, b, h)
        ys.append((hs * Ct[:, sl, None, :]).sum(-1) + D * u[:, sl])
        h = hs[:, -1]
    return torch.cat(ys, dim=1), h


class SelectiveSSM(nn.Module):
    def __init__(self, cfg, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        E, N = cfg.ssm_expand * cfg.dim, cfg.ssm_state
        self.E, self.N, self.scan = E, N, cfg.scan
        rank = max(1, math.ceil(cfg.dim / 16))
        self.in_proj = nn.Linear(cfg.dim, 2 * E, bias=False)
        self.conv = ShortConv(E, cfg.short_conv) if cfg.short_conv else None
        self.dt_down = nn.Linear(E, rank, bias=False)
        self.dt_up = nn.Linear(rank, E, bias=True)
        # Mamba's step-size init: Delta starts log-uniform in [1e-3, 1e-1] per channel (the bias is softplus's
        # inverse of it). With a zero bias Delta starts at softplus(0) = 0.69 and the state decays by
        # exp(-0.69 n) a token: it forgot within a token or two and stayed at chance on recall.
        dt = torch.exp(torch.empty(E).uniform_(math.log(DT_RANGE[0]), math.log(DT_RANGE[1])))
        with torch.no_grad():
            self.dt_up.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.bc = nn.Linear(E, 2 * N, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1).float()).repeat(E, 1))  # S4D-real init
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, cfg.dim, bias=False)
        # The output gate silu(z + b) starts open (b = 2: silu(2 + z) ~ 1.76 + 1.09 z) rather than Mamba's silu(z),
        # which is ~z / 2 at init: the block's output is then a product of two small terms and its gradient too, and on
        # MQAR the SSM sat at guessing among the values in context (29% at 4 pairs); with the gate open it learned it
        # (e08_remedies.py's CHANGES). The same reason as an LSTM's forget-gate bias of 1 (Jozefowicz et al. 2015).
        self.gate_bias = None if cfg.ssm_gate_bias is None else nn.Parameter(torch.full((E,), float(cfg.ssm_gate_bias)))

    def forward(self, x, positions, pos_enc, state=None, force: str | None = None):
        B, T, _ = x.shape
        u, gate = self.in_proj(x).chunk(2, dim=-1)  # (B, T, E) each
        if self.conv is not None:
            u = self.conv.mix(u, state, self.layer_idx)
        delta = F.softplus(self.dt_up(self.dt_down(u)))  # (B, T, E) > 0
        Bt, Ct = self.bc(u).chunk(2, dim=-1)  # (B, T, N)
        A = -torch.exp(self.A_log.float())  # (E, N) < 0: a decaying state
        live = None if state is None else state.valid_mask(x.device)
        if live is not None:  # filler beyond a row's length: delta = 0 gives a = 1, b = 0 (no change)
            delta = delta * live[..., None]
        h0 = state.h[self.layer_idx] if state is not None else x.new_zeros(B, self.E, self.N)
        mode = force or ("sequential" if T == 1 else self.scan)
        y, h_last = selective_scan(u, delta, A, Bt, Ct, self.D, h0, mode)  # y (B, T, E)
        if state is not None:
            state.h[self.layer_idx].copy_(h_last)
        if self.gate_bias is not None:
            gate = gate + self.gate_bias
        return self.out_proj(y * F.silu(gate))


def new_ssm_state(cfg, batch_size: int, dtype, device) -> SSMState:
    E = cfg.ssm_expand * cfg.dim
    tensors = {"h": torch.zeros(cfg.n_layers, batch_size, E, cfg.ssm_state, dtype=dtype, device=device)}
    if cfg.short_conv:
        tensors["conv"] = torch.zeros(cfg.n_layers, batch_size, cfg.short_conv - 1, E, dtype=dtype, device=device)
    return SSMState(tensors)

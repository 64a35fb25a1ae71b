"""The SSM's sequential scan as one loop with a hand-written backward: the same recurrence as
``ssm.scan_sequential``, without the (B, T, E, N) tensors.

Written out with autograd, the loop first materialises a = exp(Delta A) and b = Delta B u for the whole
sequence, stacks every h_t, and multiplies by C over the whole stack; autograd then keeps all of them and
walks back through ~5 whole-sequence passes and 3 small ops per step. At the recall experiments' shape
(B 32, T 64, E 160, N 16: 21 MB per tensor) that is memory traffic, not arithmetic: 0.34 s a training step,
the largest cost of the full report. Here each step forms its a_t and b_t from (B, E) and (B, N) slices,
reads C_t at once, and keeps only the states h_t for the backward pass, which recomputes a_t and runs the
recurrence in reverse:

    g_h  <- g_h + g_y_t C_t                  (the output's share; g_h carries the later steps' share)
    g_C_t = sum_e g_y_t h_t,   g(Delta_t A) = g_h h_{t-1} a_t,   g(Delta_t u_t) = sum_n g_h B_t,
    g_B_t = sum_e g_h Delta_t u_t,   then g_h <- g_h a_t for step t-1.

Where attnlab's kernels are built (kernels/ssm_scan.cpp) and the tensors are fp32 on the CPU, both passes run
there instead, each channel's N states in registers; the backward reruns a channel's forward rather than keep
the states. The loop below is the fallback (other dtypes and devices, no compiler).

Depth is still T dependent steps; this is an implementation of ``sequential``, not a new scan.
"""
from __future__ import annotations

import torch

from attnlab import kernels


def _native(*tensors):
    """The compiled kernels when every tensor is fp32 on the CPU, else None."""
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors):
        return kernels.native()
    return None


class SequentialScan(torch.autograd.Function):
    """u, delta (B, T, E); A (E, N); Bt, Ct (B, T, N); h0 (B, E, N) -> y (B, T, E) without D u, h_T."""

    @staticmethod
    def forward(ctx, u, delta, A, Bt, Ct, h0):
        ctx.native = _native(u, delta, A, Bt, Ct, h0)
        if ctx.native is not None:
            ins = [t.contiguous() for t in (u, delta, A, Bt, Ct, h0)]
            ctx.save_for_backward(*ins)
            return tuple(ctx.native.ssm_scan_forward(*ins))
        T = u.shape[1]
        du = delta * u  # (B, T, E)
        keep = any(ctx.needs_input_grad)
        # hs[t] is the state before step t (hs[0] = h0): the backward pass needs h_{t-1} and h_t.
        hs = u.new_empty((T + 1,) + h0.shape) if keep else None  # (T+1, B, E, N)
        if keep:
            hs[0] = h0
        ys, h = [], h0
        for t in range(T):
            a = torch.exp(delta[:, t, :, None] * A)  # (B, E, N)
            h = torch.addcmul(a * h, du[:, t, :, None], Bt[:, t, None, :])
            if keep:
                hs[t + 1] = h
            ys.append(torch.bmm(h, Ct[:, t, :, None]).squeeze(-1))  # (B, E)
        if keep:
            ctx.save_for_backward(u, delta, A, Bt, Ct, hs)
        return torch.stack(ys, dim=1), h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_y, g_last):
        if ctx.native is not None:
            u, delta, A, Bt, Ct, h0 = ctx.saved_tensors
            g_y = torch.zeros_like(u) if g_y is None else g_y.contiguous()
            g_last = torch.zeros_like(h0) if g_last is None else g_last.contiguous()
            g_u, g_delta, g_A, g_B, g_C, g_h0 = ctx.native.ssm_scan_backward(u, delta, A, Bt, Ct, h0, g_y, g_last)
            return g_u, g_delta, g_A.sum(0), g_B, g_C, g_h0  # g_A comes per batch row (B, E, N)
        u, delta, A, Bt, Ct, hs = ctx.saved_tensors
        T = u.shape[1]
        du = delta * u
        g_du, g_dA_e = torch.empty_like(u), torch.empty_like(u)  # (B, T, E): via b and via a
        g_B, g_C, g_A = torch.empty_like(Bt), torch.empty_like(Ct), torch.zeros_like(A)
        g_h = torch.zeros_like(hs[0]) if g_last is None else g_last.clone()  # (B, E, N)
        if g_y is None:
            g_y = torch.zeros_like(u)
        for t in range(T - 1, -1, -1):
            g_h = torch.addcmul(g_h, g_y[:, t, :, None], Ct[:, t, None, :])
            g_C[:, t] = torch.bmm(g_y[:, t, None, :], hs[t + 1]).squeeze(1)  # (B, N)
            a = torch.exp(delta[:, t, :, None] * A)  # recomputed: cheaper than keeping (T, B, E, N)
            g_dA = g_h * hs[t] * a  # (B, E, N): the gradient of Delta_t A
            g_dA_e[:, t] = (g_dA * A).sum(-1)  # (B, E): d(Delta A)/d(Delta) = A
            g_A += torch.einsum("ben,be->en", g_dA, delta[:, t])
            g_du[:, t] = torch.bmm(g_h, Bt[:, t, :, None]).squeeze(-1)  # (B, E)
            g_B[:, t] = torch.bmm(du[:, t, None, :], g_h).squeeze(1)  # (B, N)
            g_h = g_h * a
        return g_du * delta, g_dA_e + g_du * u, g_A, g_B, g_C, g_h


def sequential_scan(u, delta, A, Bt, Ct, h0):
    """y (B, T, E) (before the D u skip) and h_T, through ``SequentialScan``."""
    return SequentialScan.apply(u, delta, A, Bt, Ct, h0)

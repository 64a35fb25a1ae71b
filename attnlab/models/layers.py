"""Building blocks shared by the transformer: norms and the two MLP variants."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from attnlab import kernels


class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019: x / rms(x) * w; no mean subtraction, no bias (Llama)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # Normalise in fp32 for stability under bf16, as Llama does.
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def build_norm(cfg) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.dim, cfg.norm_eps)
    return nn.LayerNorm(cfg.dim, eps=cfg.norm_eps, bias=cfg.bias)


class MLP(nn.Module):
    """GELU: w2(gelu(w1 x)) (GPT-2, tanh approximation). SwiGLU: w2(silu(w1 x) * w3 x) (Shazeer 2020, Llama)."""

    def __init__(self, cfg):
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=cfg.bias)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=cfg.bias)
        if self.gated:
            self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=cfg.bias)

    def forward(self, x):
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(gelu_tanh_(self.w1(x)))


class _GeluTanh(torch.autograd.Function):
    """Training's compiled GELU: forward and backward in attnlab's kernels (activations.h), the input kept."""

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        return kernels.native().gelu_tanh_forward(h)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        return kernels.native().gelu_tanh_backward(h, g.contiguous())


def gelu_tanh_(h: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation, which may overwrite ``h`` (pass a fresh tensor: here a Linear's output). A large
    fp32 activation on a CPU goes through attnlab's compiled GELU: in place outside autograd, forward and backward
    under it; a bf16 one (a bf16 or int8 model's prefill) in place outside autograd. torch's CPU GELU (tanh form) is
    a visible share of a prefill and of a small model's training step; the compiled one is vectorised (the same
    formula, tanh via exp, absolute error ~1e-7; docs/engine.md). Under a dispatch-level tracer (measure.trace),
    torch's, which the tracer sees."""
    if (h.dtype in (torch.float32, torch.bfloat16) and h.device.type == "cpu" and h.numel() >= _GELU_MIN
            and h.is_contiguous() and _current_dispatch_mode() is None):
        mod = kernels.native()
        if mod is not None:
            if torch.is_grad_enabled() and h.requires_grad:
                if h.dtype == torch.float32:
                    return _GeluTanh.apply(h)
            else:
                mod.gelu_tanh_(h)  # a bf16 h: each value widened, computed in fp32, rounded once
                return h
    return F.gelu(h, approximate="tanh")


_GELU_MIN = 1 << 16  # below this a decode-sized activation: the call overhead is the cost either way

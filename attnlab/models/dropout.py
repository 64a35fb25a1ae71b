"""Dropout with a cheaper mask on the CPU.

torch's CPU dropout draws one random number per element (``bernoulli_``), enough to be a large share of a small
model's training step (SASRec's; docs/recommendation.md). Here one 64-bit random word gives the keep-or-drop
decision of four elements (each 16 bits compared with a threshold), with the same inverted scaling (kept elements
times 1 / (1 - p)). The drop probability is p
rounded to a multiple of 2^-16 (off by at most 7.6e-6). Other devices use torch's own kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def keep_mask(shape: torch.Size | tuple, p: float, device=None) -> torch.Tensor:
    """A bool tensor of ``shape``: each element kept with probability 1 - p (p rounded to k / 2^16), from the
    global generator (torch.manual_seed makes it repeatable)."""
    n = math.prod(shape)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    halves = words.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    return halves >= -32768 + round(p * 65536)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * (keep_mask(x.shape, p, x.device).to(x.dtype) * (1.0 / (1.0 - p)))


class Dropout(nn.Module):
    """nn.Dropout's interface (``p``, train / eval) with the cheaper CPU mask."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p!r} must be in [0, 1)")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"

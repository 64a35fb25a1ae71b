"""Choosing the next token: greedy, temperature, top-k, top-p (nucleus), repetition penalty; seedable.

Sampling stays on the device (no host sync): ``torch.multinomial`` with an explicit generator.
Logprobs returned are the model's own log-softmax of the raw logits for the chosen token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0  # 0 -> no cut
    top_p: float = 1.0  # 1 -> no cut
    repetition_penalty: float = 1.0  # CTRL (Keskar et al. 2019): divide positive / multiply negative logits
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise AttnlabError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        if self.top_k < 0:
            raise AttnlabError(f"top_k={self.top_k} must be >= 0 (0 keeps the whole vocabulary)")
        if not 0 < self.top_p <= 1:
            raise AttnlabError(f"top_p={self.top_p} must be in (0, 1] (1 keeps the whole vocabulary)")
        if not self.repetition_penalty > 0:
            raise AttnlabError(f"repetition_penalty={self.repetition_penalty} must be > 0 (1 disables it)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """logits (B, V); seen (B, N) ids already in each sequence (-1 = none)."""
    if penalty == 1.0 or seen is None or seen.numel() == 0:
        return logits
    ids = seen.clamp(min=0)
    got = logits.gather(1, ids)
    got = torch.where(got > 0, got / penalty, got * penalty)
    got = torch.where(seen >= 0, got, logits.gather(1, ids))  # padding ids keep their logit
    return logits.scatter(1, ids, got)


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(B, V) logits -> the distribution actually sampled from, after temperature, top-k and top-p."""
    logits = logits.float() / max(params.temperature, 1e-8)
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= params.top_p, 0.0)  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def greedy_rows(logits: torch.Tensor) -> tuple[list[bool], list[int], list[float]]:
    """Greedy picks for (b, V) logits: (whether each row is finite, its argmax, that token's log-probability).
    One fp32 copy serves all three (reductions over a bf16 vocabulary run slower). Three reductions, not an
    elementwise test, each a pass over the row: a NaN or +inf anywhere makes the log-sum-exp non-finite and a -inf makes
    the minimum so, and the maximum is the picked token's logit (a third of the time of isfinite().all(), argmax and
    gather over a large batch: docs/engine.md)."""
    rows = logits.float()
    top, ids = rows.max(-1)
    lse = torch.logsumexp(rows, -1)
    finite = (torch.isfinite(lse) & torch.isfinite(rows.amin(-1))).tolist()
    return finite, ids.tolist(), (top - lse).tolist()


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           seen: torch.Tensor | None = None):
    """logits (B, V) -> (ids (B,), logprobs (B,)) of the chosen tokens under the raw model."""
    # One fp32 copy serves argmax, sampling and the log-probability: torch's reductions over a bf16 vocabulary are
    # slower on a CPU than the conversion plus an fp32 reduction (docs/engine.md).
    logits = apply_repetition_penalty(logits.float(), seen, params.repetition_penalty)
    if params.greedy:
        ids = logits.argmax(-1)
    else:
        ids = torch.multinomial(processed_probs(logits, params), 1, generator=generator).squeeze(-1)
    logprobs = logits.gather(1, ids[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return ids, logprobs

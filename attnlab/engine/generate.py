"""A plain generation loop over the contract: prefill once, then decode one token per call.

    state = model.new_state(B, max_len)
    logits, state = model(prompt, state)        # prefill: T = prompt length, parallel
    repeat: logits, state = model(next, state)  # decode: T = 1, sequential

Timing is what the user waits for: time-to-first-token runs from the call until the first new token
id exists; time per output token is the remaining time over the remaining tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from attnlab.errors import AttnlabError


@dataclass
class GenerateResult:
    tokens: list[int]
    prompt_tokens: int
    ttft_s: float
    tpot_s: float
    total_s: float
    state_bytes: int
    timings_s: list[float] = field(default_factory=list)

    @property
    def decode_tok_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else float("inf")

    @property
    def prefill_tok_per_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else float("inf")


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator | None):
    """logits (B, V) -> (B,) ids. temperature 0 is greedy; top_k 0 keeps the whole vocabulary."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(model, prompt: list[int], max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
             seed: int = 0) -> GenerateResult:
    if not prompt:
        raise AttnlabError("the prompt is empty; give at least one token of text")
    if max_new_tokens <= 0:
        raise AttnlabError(f"max_new_tokens={max_new_tokens} must be > 0")
    if temperature < 0:
        raise AttnlabError(f"temperature={temperature} must be >= 0 (0 means greedy)")
    cfg = model.cfg
    total = len(prompt) + max_new_tokens
    if not cfg.is_recurrent and total > cfg.max_seq_len:
        raise AttnlabError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) = {total} tokens exceeds "
                           f"the model's max_seq_len {cfg.max_seq_len}; shorten the prompt or ask for fewer tokens")
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    state = model.new_state(1, total)
    t0 = time.perf_counter()
    logits, state = model(torch.tensor([prompt], device=device), state)
    nxt = sample_next(logits[:, -1], temperature, top_k, gen)
    out = [int(nxt)]  # int() waits for the value: the first token now exists
    stamps = [time.perf_counter() - t0]
    for _ in range(max_new_tokens - 1):
        logits, state = model(nxt[:, None], state)
        nxt = sample_next(logits[:, -1], temperature, top_k, gen)
        out.append(int(nxt))
        stamps.append(time.perf_counter() - t0)
    ttft = stamps[0]
    tpot = (stamps[-1] - ttft) / (len(out) - 1) if len(out) > 1 else 0.0
    return GenerateResult(tokens=out, prompt_tokens=len(prompt), ttft_s=ttft, tpot_s=tpot, total_s=stamps[-1],
                          state_bytes=state.nbytes, timings_s=stamps)

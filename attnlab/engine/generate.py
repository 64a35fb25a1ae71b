"""Generation for a batch of prompts, on the scheduler's one step.

    state = model.new_state(B, max_len)        # KV cache (written by index) or recurrent state
    logits = prefill(model, prompts, state)    # one parallel pass over every prompt token
    repeat: logits = decode_one_token(model, next_ids, state)   # one dependent step per token

``generate`` submits every prompt to a ``Scheduler`` and steps it until all are done: the prompts, of any
lengths, are prefilled in one ragged forward, then each step decodes every unfinished sequence by one
token, each at its own position. ``use_cache=False`` recomputes the whole text for every new token, for
comparison. Timings are what a user waits for: time-to-first-token (TTFT) runs from the call until the
first new token of every sequence exists; time per output token (TPOT) is the rest of the time over the
remaining steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from attnlab.engine.sampling import SamplingParams, sample
from attnlab.engine.scheduler import Scheduler
from attnlab.engine.scheduler import Sequence as Seq
from attnlab.engine.stops import StopChecker
from attnlab.errors import AttnlabError


@dataclass
class GenerationStats:
    prompt_tokens: int  # real (unpadded) prompt tokens, summed over the batch
    new_tokens: int  # generated tokens, summed over the batch
    ttft_s: float
    tpot_s: float
    total_s: float
    state_bytes: int
    use_cache: bool = True
    reused_prefix_tokens: int = 0
    accepted: float | None = None  # speculative decoding: share of proposed draft tokens accepted
    rounds: int = 0  # speculative decoding: verification passes
    proposed: int = 0  # speculative decoding: draft tokens proposed

    @property
    def prefill_tok_per_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else float("inf")

    @property
    def decode_tok_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": self.new_tokens, "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s, "total_s": self.total_s, "prefill_tok_per_s": self.prefill_tok_per_s,
                "decode_tok_per_s": self.decode_tok_per_s, "cache_bytes": self.state_bytes,
                "use_cache": self.use_cache, "reused_prefix_tokens": self.reused_prefix_tokens,
                "accepted": self.accepted, "rounds": self.rounds, "proposed": self.proposed}


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str = "length"  # "length" or "stop"
    text: str | None = None


@dataclass
class GenerationOutput:
    completions: list[Completion]
    stats: GenerationStats
    timings_s: list[float] = field(default_factory=list)  # since the call, when each step's tokens existed

    @property
    def tokens(self) -> list[int]:
        return self.completions[0].tokens


def prefill(model, tokens: torch.Tensor, state, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Run the prompts (B, T) through the model in one pass; return each row's last real logits (B, V)."""
    logits, _ = model(tokens, state, last_only=True, lengths=lengths)
    return logits[:, -1]


def decode_one_token(model, ids: torch.Tensor, state) -> torch.Tensor:
    """Feed one token per sequence (B,); return next-token logits (B, V)."""
    logits, _ = model(ids[:, None], state)
    return logits[:, -1]


def check_request(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, truncate: str | None = None):
    """Validate a request against the model; returns the (possibly left-truncated) prompts."""
    if not prompts:
        raise AttnlabError("no prompts given")
    if any(len(p) == 0 for p in prompts):
        raise AttnlabError("the prompt is empty; give at least one token of text")
    if max_new_tokens <= 0:
        raise AttnlabError(f"max_new_tokens={max_new_tokens} must be > 0")
    cfg = model.cfg
    vocab = cfg.vocab_size
    for p in prompts:
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise AttnlabError(f"prompt token ids {bad[:3]} are outside the model's vocabulary 0..{vocab - 1}")
    if cfg.is_recurrent:
        return [list(p) for p in prompts]
    limit = cfg.max_seq_len
    if max_new_tokens >= limit:
        raise AttnlabError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                           f"context of {limit} tokens; ask for at most {limit - 1}")
    out = []
    for p in prompts:
        if len(p) + max_new_tokens > limit:
            if truncate != "left":
                raise AttnlabError(f"prompt of {len(p)} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                                   f"context of {limit} tokens; shorten the prompt, lower max_new_tokens, or pass "
                                   "--truncate left to keep the prompt's last tokens")
            p = p[len(p) - (limit - max_new_tokens):]
        out.append(list(p))
    return out


def generate(model, prompts: Sequence[Sequence[int]] | Sequence[int], max_new_tokens: int,
             params: SamplingParams | None = None, stop_tokens=(), stop_strings=(), tokenizer=None,
             use_cache: bool = True, cache_dtype=None, truncate: str | None = None, paged: bool = False,
             proposer=None) -> GenerationOutput:
    """Generate for one prompt (a list of ids) or a batch (a list of lists). Returns completions + timings.

    Every prompt runs with the same sampling settings, each sequence with its own seeded generator."""
    params = params or SamplingParams()
    if not prompts or isinstance(prompts[0], int):  # one prompt given as a flat list of ids
        prompts = [list(prompts)]
    prompts = check_request(model, prompts, max_new_tokens, truncate)
    t0 = time.perf_counter()
    if not use_cache:
        return _generate_recomputing(model, prompts, max_new_tokens, params, stop_tokens, stop_strings, tokenizer)
    extra = proposer.k + 1 if proposer is not None else 0
    sched = Scheduler(model, max_len=max(len(p) for p in prompts) + max_new_tokens + extra, cache_dtype=cache_dtype,
                      paged=paged, proposer=proposer, max_batch=len(prompts))
    seqs = [sched.submit(Seq(p, max_new_tokens, params, StopChecker(stop_tokens, stop_strings, tokenizer)))
            for p in prompts]
    stamps = []
    state_bytes = 0
    while sched.has_work:
        if sched.step():
            stamps.append(time.perf_counter() - t0)
            state_bytes = max(state_bytes, sched.state.nbytes + sched.prefill_state.nbytes)
    return finish_output(seqs, stamps, tokenizer, state_bytes, True, t0=t0)


def _generate_recomputing(model, prompts, max_new_tokens, params, stop_tokens, stop_strings, tokenizer):
    """No cache: run the whole text so far through a fresh state for every new token (O(n) work per token)."""
    t0 = time.perf_counter()
    seqs = [Seq(p, max_new_tokens, params, StopChecker(stop_tokens, stop_strings, tokenizer)) for p in prompts]
    for s in seqs:
        s.submitted, s.gen = t0, torch.Generator(device=next(model.parameters()).device).manual_seed(params.seed)
    stamps = []
    with torch.inference_mode():
        while not all(s.done for s in seqs):
            live = [s for s in seqs if not s.done]
            texts = [s.text for s in live]
            lengths = torch.tensor([len(t) for t in texts])
            T = int(lengths.max())
            tokens = torch.tensor([t + [0] * (T - len(t)) for t in texts], device=next(model.parameters()).device)
            logits = prefill(model, tokens, model.new_state(len(live), T), lengths)
            now = time.perf_counter() - t0
            for r, s in enumerate(live):
                seen = torch.tensor([s.text], device=logits.device) if params.repetition_penalty != 1.0 else None
                ids, lps = sample(logits[r:r + 1], params, s.gen, seen)
                s.tokens.append(int(ids[0]))
                s.logprobs.append(float(lps[0]))
                s.stamps_s.append(now)
                if s.stopper.done(s.tokens):
                    s.finish_reason = "stop"
                elif len(s.tokens) >= s.max_new_tokens:
                    s.finish_reason = "length"
            stamps.append(now)
    return finish_output(seqs, stamps, tokenizer, 0, False, t0=t0)


def finish_output(seqs: list[Seq], stamps: list[float], tokenizer, state_bytes: int, use_cache: bool,
                  t0: float | None = None) -> GenerationOutput:
    """Completions and timings of finished sequences. TTFT: until every sequence's first token existed. A
    sequence that ended in a fault of its own (non-finite logits, sampling) is an error for the caller."""
    failed = [s for s in seqs if s.finish_reason == "error"]
    if failed:
        raise AttnlabError(f"generation failed: {failed[0].error}")
    comps = []
    for s in seqs:
        text = None
        if tokenizer is not None:
            text = tokenizer.decode_text(s.tokens)
            if s.stopper.stop_strings:
                text = s.stopper.trim_text(text)
        comps.append(Completion(tokens=list(s.tokens), logprobs=list(s.logprobs),
                                finish_reason="stop" if s.finish_reason == "stop" else "length", text=text))
    offset = (seqs[0].submitted - t0) if t0 is not None and seqs[0].submitted else 0.0
    ttft = max(s.stamps_s[0] for s in seqs) + offset
    total = max(s.stamps_s[-1] for s in seqs) + offset
    steps = max(len(s.tokens) for s in seqs)
    tpot = (total - ttft) / (steps - 1) if steps > 1 else 0.0
    proposed = sum(s.proposed for s in seqs)
    stats = GenerationStats(prompt_tokens=sum(len(s.prompt) for s in seqs), new_tokens=sum(len(s.tokens) for s in seqs),
                            ttft_s=ttft, tpot_s=tpot, total_s=total, state_bytes=state_bytes, use_cache=use_cache,
                            reused_prefix_tokens=sum(s.cached_tokens for s in seqs),
                            accepted=(sum(s.accepted for s in seqs) / proposed) if proposed else None,
                            rounds=sum(s.rounds for s in seqs), proposed=proposed)
    return GenerationOutput(completions=comps, stats=stats, timings_s=stamps or [s for s in seqs[0].stamps_s])


def sample_continuations(model, ids: torch.Tensor, n: int, prompt_len: int, new_tokens: int, seed: int = 0,
                         batch: int = 32) -> list[list[int]]:
    """n prompts of prompt_len tokens drawn at random from ``ids`` (seeded), each followed by the model's greedy
    continuation of new_tokens: the text a draft distilled from this model will be asked to predict. The prompts
    share one length, so `batch` of them decode together with no padding (32 at a time: ~20x the throughput
    of one at a time on this project's 2-core CPU)."""
    starts = torch.randint(0, len(ids) - prompt_len - new_tokens, (n,),
                           generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for b in range(0, n, batch):
        prompts = [ids[s:s + prompt_len].tolist() for s in starts[b:b + batch]]
        out += [p + c.tokens for p, c in zip(prompts, generate(model, prompts, new_tokens).completions)]
    return out

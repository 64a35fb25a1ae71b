"""What a generation returns: completions, and timings as a user waits for them.

TTFT (time to first token) runs from the call until the first new token of every sequence exists; TPOT (time
per output token) is the rest of the time over the remaining steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from attnlab.engine.request import Result
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


def finish_output(results: list[Result], stamps: list[float], state_bytes: int, use_cache: bool,
                  t0: float | None = None) -> GenerationOutput:
    """Completions and timings of finished requests (their last events' results). TTFT: until every sequence's
    first token existed. A request that failed (non-finite logits, sampling) is an error for the caller."""
    failed = [r for r in results if r.finish_reason == "error"]
    if failed:
        raise AttnlabError(f"generation failed: {failed[0].error}")
    comps = [Completion(tokens=list(r.tokens), logprobs=list(r.logprobs),
                        finish_reason="stop" if r.finish_reason == "stop" else "length", text=r.text) for r in results]
    offset = (results[0].added_s - t0) if t0 is not None and results[0].added_s else 0.0
    ttft = max(r.stamps_s[0] for r in results) + offset
    total = max(r.stamps_s[-1] for r in results) + offset
    steps = max(len(r.tokens) for r in results)
    tpot = (total - ttft) / (steps - 1) if steps > 1 else 0.0
    proposed = sum(r.proposed for r in results)
    stats = GenerationStats(prompt_tokens=sum(r.prompt_tokens for r in results),
                            new_tokens=sum(len(r.tokens) for r in results), ttft_s=ttft, tpot_s=tpot, total_s=total,
                            state_bytes=state_bytes, use_cache=use_cache,
                            reused_prefix_tokens=sum(r.cached_tokens for r in results),
                            accepted=(sum(r.accepted for r in results) / proposed) if proposed else None,
                            rounds=sum(r.rounds for r in results), proposed=proposed)
    return GenerationOutput(completions=comps, stats=stats, timings_s=stamps or list(results[0].stamps_s))

"""``Engine``: one model + tokenizer, streaming text as tokens are chosen, reusing cached prefixes.

The engine keeps one state (a KV cache sized to the model's context, allocated once, or the
recurrent state) and the tokens it holds. A new request that shares a prefix with them skips
recomputing it: a KV cache is rolled back to the shared length (later slots are simply overwritten);
a recurrent state can only be reused when the new prompt extends exactly what it has read.
This is what makes a multi-turn chat cost O(new tokens) per turn instead of O(history).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from attnlab.engine.generate import (Completion, GenerationOutput, StopChecker, _finish, check_request, run_steps)
from attnlab.engine.sampling import SamplingParams
from attnlab.errors import AttnlabError


@dataclass
class StreamEvent:
    index: int  # 0-based position of this token among the generated ones
    token: int
    text: str  # the new text this token completes (may be "" while a UTF-8 character is incomplete)
    logprob: float
    elapsed_s: float
    finish_reason: str | None = None  # set on the last event
    output: GenerationOutput | None = None  # set on the last event: completion + timings


class Engine:
    def __init__(self, model, tokenizer=None, cache_dtype=None, prefix_reuse: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.cache_dtype = cache_dtype
        self.prefix_reuse = prefix_reuse
        self._state = None
        self._held: list[int] = []  # tokens whose keys/values (or recurrent effect) the state holds

    def encode(self, prompt: str | bytes | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if self.tokenizer is None:
            raise AttnlabError("this engine has no tokenizer: pass token ids")
        if isinstance(prompt, bytes) and self.tokenizer.name != "byte":
            try:
                prompt = prompt.decode("utf-8")
            except UnicodeDecodeError as e:
                raise AttnlabError(f"the prompt is not valid UTF-8 ({e}); fix the input encoding") from None
        return self.tokenizer.encode(prompt)

    def _claim_state(self, prompt: list[int], max_new_tokens: int):
        """-> (state, tokens already in it). Reuses the held state when the prompt shares its prefix."""
        model = self.model
        need = len(prompt) + max_new_tokens
        state, shared = self._state, 0
        if self.prefix_reuse and state is not None and self._held:
            shared = _common_prefix(prompt, self._held)
            shared = min(shared, len(prompt) - 1)  # at least one prompt token must run to give logits
            capacity = getattr(state, "max_len", None)
            try:
                if shared <= 0 or (capacity is not None and need > capacity):
                    raise AttnlabError("no reuse")
                state.rollback(shared)
            except AttnlabError:
                state, shared = None, 0
        else:
            state = None
        if state is None:
            size = need if model.cfg.is_recurrent else max(need, model.cfg.max_seq_len)
            if self._state is not None and getattr(self._state, "max_len", -1) >= size:
                state = self._state  # the preallocated cache, reused from slot 0
            else:
                state = model.new_state(1, size, dtype=self.cache_dtype)
            state.reset()
        return state, shared

    def stream(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
               stop_strings=(), truncate: str | None = None) -> Iterator[StreamEvent]:
        params = params or SamplingParams()
        ids = check_request(self.model, [self.encode(prompt)], max_new_tokens, truncate)[0]
        stopper = StopChecker(stop_tokens, stop_strings, self.tokenizer)
        state, shared = self._claim_state(ids, max_new_tokens)
        self._state, self._held = state, []  # if this request fails half-way, nothing stale is reused
        comp = Completion(tokens=[], logprobs=[])
        stamps, emitted = [], ""
        t0 = time.perf_counter()
        steps = run_steps(self.model, [ids], max_new_tokens, params, stopper, True, self.cache_dtype, state, shared)
        for step, tok, lp, finished, now, state in steps:
            comp.tokens.append(tok[0])
            comp.logprobs.append(lp[0])
            stamps.append(now)
            last = finished[0] or step == max_new_tokens - 1
            delta = ""
            if self.tokenizer is not None:
                text = self.tokenizer.decode_text(comp.tokens)
                if stopper.stop_strings:
                    text = stopper.trim_text(text)
                if last or not text.endswith("\ufffd"):  # hold back a character still incomplete
                    delta, emitted = text[len(emitted):], text
            if last:
                comp.finish_reason = "stop" if finished[0] else "length"
                self._held = ids + comp.tokens[:-1]  # the last token was sampled, never fed
                output = _finish([comp], stamps, [ids], stopper, self.tokenizer, state, True, shared)
                yield StreamEvent(step, tok[0], delta, lp[0], time.perf_counter() - t0, comp.finish_reason, output)
                return
            yield StreamEvent(step, tok[0], delta, lp[0], now)

    def generate(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
                 stop_strings=(), truncate: str | None = None) -> GenerationOutput:
        for event in self.stream(prompt, max_new_tokens, params, stop_tokens, stop_strings, truncate):
            if event.output is not None:
                return event.output
        raise AssertionError("stream ended without a final event")


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n

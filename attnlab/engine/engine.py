"""``Engine``: one model + tokenizer, streaming text as tokens are chosen, reusing cached prefixes.

The engine keeps one scheduler across requests. For softmax attention its KV cache is paged: a finished
request's full blocks stay keyed by their prefix in the pool, so a new request that starts the same way
(the next turn of a chat) takes them instead of recomputing them. States that cannot be shared by block (a
recurrent, linear-attention or SSM state, a sliding ring) are kept whole after a request and reused when
the next prompt extends exactly what they have read. This is what makes a multi-turn chat cost O(new
tokens) per turn instead of O(history).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from attnlab.engine.generate import GenerationOutput, check_request, finish_output
from attnlab.engine.sampling import SamplingParams
from attnlab.engine.scheduler import Scheduler, Sequence, shares_blocks
from attnlab.engine.stops import StopChecker
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
    def __init__(self, model, tokenizer=None, cache_dtype=None, prefix_reuse: bool = True, kv_blocks: int | None = None,
                 block_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.cache_dtype = cache_dtype
        self.prefix_reuse = prefix_reuse
        cfg = model.cfg
        self.paged = shares_blocks(cfg)
        # room for a full context plus what the prefix cache keeps beside it
        self.scheduler = Scheduler(model, max_len=cfg.max_seq_len, cache_dtype=cache_dtype, paged=self.paged,
                                   kv_blocks=kv_blocks or 2 * -(-cfg.max_seq_len // block_size),
                                   block_size=block_size, keep_finished=not self.paged)
        self._kept = None  # non-paged: the last request's state and the tokens it has read

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

    def _reusable_state(self, ids: list[int]):
        """Non-paged states: the kept state when the prompt extends exactly what it has read."""
        if self.paged or not self.prefix_reuse or self._kept is None:
            return None
        state, held = self._kept
        self._kept = None
        if len(held) < len(ids) and ids[:len(held)] == held:
            return state
        return None

    def stream(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
               stop_strings=(), truncate: str | None = None) -> Iterator[StreamEvent]:
        params = params or SamplingParams()
        ids = check_request(self.model, [self.encode(prompt)], max_new_tokens, truncate)[0]
        stopper = StopChecker(stop_tokens, stop_strings, self.tokenizer)
        seq = Sequence(ids, max_new_tokens, params, stopper)
        seq.state = self._reusable_state(ids)
        if self.paged and not self.prefix_reuse:
            seq.state = self.model.new_state(1, pool=self.scheduler.pool)  # an empty row: no cached prefix
        t0 = time.perf_counter()
        self.scheduler.submit(seq)
        emitted = ""
        try:
            while not seq.done:
                for event in self.scheduler.step():
                    if event.seq is not seq:
                        continue
                    delta = ""
                    if self.tokenizer is not None:
                        text = self.tokenizer.decode_text(seq.tokens)
                        if stopper.stop_strings:
                            text = stopper.trim_text(text)
                        if event.finished or not text.endswith("\ufffd"):  # hold back an incomplete character
                            delta, emitted = text[len(emitted):], text
                    i = len(seq.tokens) - 1
                    if event.finished:
                        if seq.state is not None:  # keep_finished: reusable by the next request
                            self._kept, seq.state = (seq.state, seq.text[:-1]), None
                        output = finish_output([seq], seq.stamps_s, self.tokenizer, self._state_bytes(seq), True)
                        yield StreamEvent(i, event.token, delta, event.logprob, time.perf_counter() - t0,
                                          seq.finish_reason, output)
                        return
                    yield StreamEvent(i, event.token, delta, event.logprob, time.perf_counter() - t0)
        finally:
            self.scheduler.cancel(seq)  # a consumer that stops early frees the sequence's state

    def _state_bytes(self, seq: Sequence) -> int:
        """Bytes the request's state held at its end: its blocks, or the whole kept state."""
        if self.paged:
            pool = self.scheduler.pool
            return -(-(len(seq.text) - 1) // pool.block_size) * pool.bytes_per_block
        return self._kept[0].nbytes if self._kept else 0

    def generate(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
                 stop_strings=(), truncate: str | None = None) -> GenerationOutput:
        for event in self.stream(prompt, max_new_tokens, params, stop_tokens, stop_strings, truncate):
            if event.output is not None:
                return event.output
        raise AssertionError("stream ended without a final event")

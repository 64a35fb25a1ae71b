"""``Engine``: the one inference API. ``add(request) -> id``, ``step() -> events``, ``abort(id)``, ``stats()``,
``check(request)``; ``generate``, speculative decoding, the cost model's engine timing and the server all drive it.

The engine owns one ``Scheduler`` (scheduler.py: one batched step for every sequence) and is the only place that
decides how decode state is held and how much of it there is:

- paged or contiguous: softmax attention shares a paged KV pool by block (``shares_blocks``); recurrent,
  linear-attention and SSM states and a sliding window's ring keep one contiguous row per sequence;
- the pool's size: ``kv_blocks``, by default ``max_batch * ceil(max_len / block_size)`` blocks, so that every
  sequence of a full batch can grow to ``max_len`` without a preemption. Blocks a finished request leaves
  behind stay cached for the next request until a running one needs them.

Prefix reuse: in the paged pool a finished request's full blocks stay keyed by their prefix (salted by
``cache_salt``), so a request that starts the same way takes them instead of recomputing them. A state that
cannot be shared by block is kept whole after a request and reused when the next prompt (of the same salt)
extends exactly what it has read. This is what makes a multi-turn chat cost O(new tokens) per turn instead of
O(history).

Every token comes out as an ``Event`` (request.py) with the text it makes safe to show, from the one incremental
detokenizer and stop matcher (detok.py); a request's last event says how it ended (finished, cancelled, failed)
and carries its whole ``Result``.
"""
from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from typing import Iterator

import torch

from attnlab.engine.detok import TextStream
from attnlab.engine.fast import inference
from attnlab.engine.output import GenerationOutput, finish_output
from attnlab.engine.request import FINISHED, Event, Request, RequestError, Sequence, check_prompt
from attnlab.engine.sampling import SamplingParams
from attnlab.engine.scheduler import Scheduler
from attnlab.errors import AttnlabError, ConfigError
from attnlab.kernels import paths
from attnlab.models.block_pool import KV_BLOCK_SIZE

log = logging.getLogger("attnlab.engine")


def shares_blocks(cfg) -> bool:
    """Whether a model's decode state can live in a paged pool shared by block: softmax attention over the whole
    context does; recurrent states and a sliding window's rolling buffer do not."""
    return cfg.family == "transformer" and cfg.kernel != "sliding"


@dataclass
class EngineConfig:
    max_batch: int = 1  # sequences decoded together (with a paged pool, each has room for a full context)
    max_len: int | None = None  # tokens a sequence may hold (prompt + output); None: the model's max_seq_len
    prefill_chunk: int | None = None  # prompt tokens a prompt feeds per step; None: a whole prompt in one step
    prefill_budget: int | None = None  # prompt tokens per step across prompts; None: no cap
    paged: bool | None = None  # None: paged where the model's state can be shared by block (shares_blocks)
    kv_blocks: int | None = None  # paged pool size; None: max_batch * ceil(max_len / block_size)
    block_size: int = KV_BLOCK_SIZE  # tokens per KV block
    cache_dtype: torch.dtype | None = None  # None: the model's cache dtype
    prefix_reuse: bool = True  # reuse what earlier requests computed (cached blocks, or a kept state)
    raise_faults: bool = True  # a failed forward raises (a library call); False: its requests fail (a server)

    def __post_init__(self) -> None:
        for name in ("max_batch", "block_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"EngineConfig.{name}={getattr(self, name)} must be >= 1")
        for name in ("max_len", "prefill_chunk", "prefill_budget", "kv_blocks"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"EngineConfig.{name}={value} must be >= 1 (None: {name}'s default)")


class Engine:
    def __init__(self, model, config: EngineConfig | None = None, tokenizer=None, proposer=None):
        """``model``: any model of the contract, run as an InferenceModel (engine/fast: set_precision's, or this one
        wrapped as it stands). ``tokenizer``: text prompts, text in events, stop strings. ``proposer``: drafts for
        speculative decoding (speculative.py), verified in the same step."""
        model = inference(model)
        self.model, self.tokenizer, self.proposer = model, tokenizer, proposer
        self._paths_at_start = paths.snapshot()
        self.config = cfg = config or EngineConfig()
        self.max_len = cfg.max_len or model.cfg.max_seq_len
        can_page = shares_blocks(model.cfg)
        if cfg.paged and not can_page:
            raise ConfigError(f"EngineConfig.paged=True, but a {model.cfg.family} model with the "
                              f"{model.cfg.kernel!r} kernel keeps a state that cannot be shared by block; leave "
                              "paged=None to decide from the model")
        self.paged = can_page if cfg.paged is None else cfg.paged
        pool = None
        if self.paged:
            blocks = cfg.kv_blocks or cfg.max_batch * -(-self.max_len // cfg.block_size)
            pool = model.new_pool(blocks, cfg.block_size, cfg.cache_dtype)
        self.scheduler = Scheduler(model, max_len=self.max_len, max_batch=cfg.max_batch,
                                   prefill_chunk=cfg.prefill_chunk, prefill_budget=cfg.prefill_budget,
                                   cache_dtype=cfg.cache_dtype, pool=pool, proposer=proposer,
                                   keep_finished=cfg.prefix_reuse and not self.paged, raise_faults=cfg.raise_faults)
        self._live: dict[int, Sequence] = {}
        self._next_id = 0
        self._ended: list[Event] = []  # last events of aborted requests, returned by the next step
        self._kept = None  # not paged: (the last request's state, the tokens it has read, its salt)

    # -- requests ----------------------------------------------------------------------------------------
    def encode(self, prompt: str | bytes | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return prompt
        if self.tokenizer is None:
            raise RequestError("this engine has no tokenizer: pass token ids", "prompt")
        if isinstance(prompt, bytes) and self.tokenizer.name != "byte":
            try:
                prompt = prompt.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(f"the prompt is not valid UTF-8 ({e}); fix the input encoding", "prompt") from None
        return self.tokenizer.encode(prompt)

    def check(self, request: Request) -> list[int]:
        """Validate a request without running it (a server calls this before queueing); returns its prompt ids
        (left-truncated if it asked). Raises ``RequestError`` naming the field and the fix."""
        ids = check_prompt(self.model, self.encode(request.prompt), request.max_new_tokens, request.truncate,
                           self.max_len)
        n = request.max_new_tokens
        if any(request.stop_strings) and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer to decode the generated text", "stop_strings")
        if not -2 ** 63 <= request.params.seed < 2 ** 64:
            raise RequestError(f"seed={request.params.seed} is outside what a generator takes (-2**63 .. 2**64 - 1)",
                               "seed")
        if request.top_logprobs < 0:
            raise RequestError(f"top_logprobs={request.top_logprobs} must be >= 0", "top_logprobs")
        if self.proposer is not None and request.params.repetition_penalty != 1.0:
            raise RequestError("speculative decoding does not support a repetition penalty (it changes p per token)",
                               "params")
        if not self.model.cfg.is_recurrent and len(ids) + n > self.max_len:
            raise RequestError(f"prompt of {len(ids)} tokens + max_new_tokens {n} exceeds the engine's max_len of "
                               f"{self.max_len} tokens; lower max_new_tokens or give the engine a larger max_len",
                               "max_new_tokens", "context_length")
        pool = self.scheduler.pool
        if pool is not None and -(-(len(ids) + n) // pool.block_size) > pool.n_blocks:
            raise RequestError(f"this request needs {-(-(len(ids) + n) // pool.block_size)} KV blocks of "
                               f"{pool.block_size} tokens for its prompt and output; the pool holds {pool.n_blocks}: "
                               "ask for fewer output tokens, or give the engine more KV blocks (EngineConfig."
                               "kv_blocks; the server's --kv-blocks)", "max_new_tokens", "kv_capacity")
        return ids

    def add(self, request: Request) -> int:
        """Queue a request (checked first); its events come from ``step()`` under the id returned."""
        ids = self.check(request)
        seq = Sequence(ids, request.max_new_tokens, request.params,
                       TextStream(self.tokenizer, request.stop_strings, request.stop_tokens), id=self._next_id,
                       cache_salt=request.cache_salt, top_logprobs=request.top_logprobs)
        self._next_id += 1
        if self.config.prefix_reuse:
            seq.state = self._reusable_state(ids, request.cache_salt)
        elif self.paged:
            seq.state = self.model.new_state(1, pool=self.scheduler.pool)  # an empty row: no cached prefix
        self.scheduler.submit(seq)
        self._live[seq.id] = seq
        return seq.id

    def abort(self, rid: int) -> None:
        """End a request now, wherever it is (its rows and blocks are freed before the next step); the next
        ``step()`` returns its last event, ``cancelled``. A request that already ended is left as it is."""
        seq = self._live.pop(rid, None)
        if seq is not None:
            self.scheduler.cancel(seq)
            self._ended.append(seq.event())

    @property
    def has_work(self) -> bool:
        return bool(self._ended) or self.scheduler.has_work

    def stats(self) -> dict:
        """What a caller may watch without reading the queues, from any thread (counts only: a server's metrics
        read it while the engine thread steps): requests by stage, the pool, the error counts, and which kernel
        paths ran since this engine was made (kernels.paths; the counts are the process's, so another engine
        stepping meanwhile adds to them)."""
        return {**self.scheduler.stats(), "max_batch": self.config.max_batch, "max_len": self.max_len,
                "paged": self.paged, "kernel_paths": paths.since(self._paths_at_start)}

    @property
    def state_bytes(self) -> int:
        """Bytes the decode states hold now (the running batch's and the prefilling one's)."""
        return self.scheduler.state.nbytes + self.scheduler.prefill_state.nbytes

    # -- the step ----------------------------------------------------------------------------------------
    def step(self, decode: bool = True) -> list[Event]:
        """One scheduler step (admit, prefill, decode): the events it produced, after those of aborted requests.
        ``decode=False`` stops after the prefill (a caller timing the first token apart from the rest)."""
        events, self._ended = self._ended, []
        sched = self.scheduler
        if sched.has_work:
            try:
                events += sched.step(decode)
            except Exception:
                if self.config.raise_faults:
                    self._live = {i: s for i, s in self._live.items() if not s.done}
                    raise
                # a bug outside any one forward: end everything in flight and go on
                log.error("engine step failed; ending the requests in flight\n%s", traceback.format_exc())
                sched.step_errors += 1
                sched.last_error = "engine step failed outside a forward (see the log)"
                events += sched.fail([*sched.waiting, *sched.prefilling, *sched.running],
                                     "the engine failed while running this request; see the server log")
                # requests that ended in this step left the queues and their events went with the exception
                told = {e.id for e in events if e.done}
                for rid, seq in self._live.items():
                    if rid not in told:
                        seq.end("error", "the engine failed while running this request; see the server log")
                        events.append(seq.event())
        for event in events:
            if event.done:
                self._retire(event)
        return events

    def _retire(self, event: Event) -> None:
        seq = self._live.pop(event.id, None)
        if seq is None:
            return
        if self.paged:
            pool = self.scheduler.pool
            event.result.state_bytes = -(-(len(seq.text) - 1) // pool.block_size) * pool.bytes_per_block
        elif seq.state is not None:  # kept: reusable by the next request that extends it
            self._kept, seq.state = (seq.state, seq.text[:-1], seq.cache_salt), None
            event.result.state_bytes = self._kept[0].nbytes

    def _reusable_state(self, ids: list[int], salt: str):
        """Not paged: the kept state when the prompt (of the same salt) extends exactly what it has read."""
        if self.paged or self._kept is None:
            return None
        state, held, kept_salt = self._kept
        if kept_salt == salt and len(held) < len(ids) and ids[:len(held)] == held:
            self._kept = None
            return state
        return None

    # -- one request at a time ---------------------------------------------------------------------------
    def stream(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
               stop_strings=(), truncate: str | None = None) -> Iterator[Event]:
        """Run one request on an otherwise idle engine, yielding its events; the last one carries its result."""
        if self._live:
            raise AttnlabError(f"stream() runs one request on an idle engine, and {len(self._live)} are running; "
                               "drive several with add() and step()")
        rid = self.add(Request(prompt, max_new_tokens, params or SamplingParams(), stop_tokens, stop_strings,
                               truncate=truncate))
        try:
            while True:
                for event in self.step():
                    if event.id == rid:
                        yield event
                        if event.done:
                            return
        finally:
            self.abort(rid)  # a consumer that stops early frees the request's state (a no-op once it ended)

    def generate(self, prompt, max_new_tokens: int = 64, params: SamplingParams | None = None, stop_tokens=(),
                 stop_strings=(), truncate: str | None = None) -> GenerationOutput:
        for event in self.stream(prompt, max_new_tokens, params, stop_tokens, stop_strings, truncate):
            if event.done:
                return output_of(event)
        raise AssertionError("stream ended without a last event")


def output_of(event: Event) -> GenerationOutput:
    """A single request's output from its last event (an error if it did not finish)."""
    r = event.result
    if event.state != FINISHED and r.finish_reason != "error":
        raise AttnlabError(f"the request was {event.state} before it finished")
    return finish_output([r], r.stamps_s, r.state_bytes, True)

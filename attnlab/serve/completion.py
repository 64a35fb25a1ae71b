"""One request's life on the server: checked by the engine, submitted to the engine thread, its events turned into
OpenAI-shaped responses (one JSON body, or server-sent events ending with ``data: [DONE]``).

The text is the engine's: each event carries what it makes safe to show, from the one incremental detokenizer and
stop matcher (engine/detok.py), which holds back a UTF-8 character split across tokens and any tail that could
begin a stop string. Every token still gets its own event, even with empty text, so a client sees each token's
arrival (the page's timeline needs it).

The stream's contract: every chunk with a choice carries exactly one generated token, except chat's opening
chunk (``delta.role`` only); the last token's chunk carries ``finish_reason`` ("stop" or "length", OpenAI's
values only); then the usage chunk (``choices: []``) when asked for, and ``data: [DONE]``. A request that
fails, times out or is ended by a shutdown sends instead an error event in OpenAI's shape
(``data: {"error": {...}}``) before ``data: [DONE]``, so a client never mistakes a cut answer for a whole one.
"""
from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field

from attnlab.engine.request import CANCELLED, FAILED, FINISHED, Event, Request, RequestError
from attnlab.engine.sampling import SamplingParams
from attnlab.serve.protocol import ApiError
from attnlab.serve.worker import Draining, QueueFull

ABORT_GRACE_S = 30.0  # how long a timed-out request waits for the engine to confirm its abort

API_PARAM = {"max_new_tokens": "max_tokens", "stop_strings": "stop", "params": None}  # engine field -> body field


@dataclass
class Served:
    """What the server serves: a model and everything needed to talk to it in text."""

    model: object
    tokenizer: object | None
    stop_tokens: list[int]
    template: object  # chat.ChatTemplate
    name: str
    path: str
    dtype: str = "fp32"
    created: int = field(default_factory=lambda: int(time.time()))


def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode_text([token]) if tokenizer is not None else f"token_id:{token}"


class Run:
    """A submitted request: its engine request, the queue its events arrive on, and its timings."""

    def __init__(self, app_state, ids: list[int], max_tokens: int, req, stops: list[str], top_logprobs: int | None,
                 cache_salt: str = "", deadline_s: float | None = None):
        served, self.worker = app_state.served, app_state.worker
        self.served = served
        self.arrived = time.perf_counter()
        self.created = int(time.time())
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        params = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                                repetition_penalty=req.repetition_penalty, seed=seed)
        stop_tokens = [] if req.ignore_eos else served.stop_tokens
        self.request = Request(ids, max_tokens, params, stop_tokens, stops, cache_salt, top_logprobs or 0)
        try:
            self.worker.engine.check(self.request)  # refused here, before it takes a place in the queue
        except RequestError as e:
            raise ApiError(400, str(e), API_PARAM.get(e.field, e.field), e.code) from None
        self.prompt_tokens = len(ids)
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.deadline = None if deadline_s is None else self.arrived + deadline_s
        self.timed_out = False
        self.want_logprobs = top_logprobs is not None
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.last: Event | None = None  # the engine's last event for this request: how it ended
        self.recorded = False  # its metrics are counted (once, however the request ends)
        self.client_gone = False  # abandoned by its client before it finished (counted as 499)
        try:
            self.ticket = self.worker.submit(self.request, asyncio.get_running_loop(), self.queue)
        except QueueFull:
            raise ApiError(429, f"the server's queue is full ({self.worker.max_queue} requests waiting); retry "
                           "shortly", None, "queue_full", "rate_limit_error", {"Retry-After": "1"}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down and takes no new requests", None, "shutting_down",
                           "server_error") from None

    @property
    def finished(self) -> bool:
        """The request's last event has arrived."""
        return self.last is not None

    async def next(self) -> Event:
        """The next event (``event.text``: the text it makes safe to show). Past the request's deadline the run is
        aborted: the engine's own last event for it ends the run (``timed_out`` set)."""
        if self.deadline is None or self.timed_out:
            event = await self.queue.get()
        else:
            try:
                event = await asyncio.wait_for(self.queue.get(), max(0.0, self.deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                self.timed_out = True
                self.worker.cancel(self.ticket)
                event = await self._last_after_abort()
        now = time.perf_counter() - self.arrived
        if event.token is not None:
            self.first_s = now if self.first_s is None else self.first_s
            self.last_s = now
            self.completion_tokens += 1
        self.cached_tokens = event.cached_tokens
        if event.done:
            self.last = event
        return event

    async def _last_after_abort(self) -> Event:
        """The engine's own last event after an abort (tokens already on their way are skipped). An engine that does
        not answer within ABORT_GRACE_S (its thread dead or stuck in one long forward) must not hold the client too:
        the run then ends here, and /health already reports the engine."""
        end = time.perf_counter() + ABORT_GRACE_S
        while True:
            try:
                event = await asyncio.wait_for(self.queue.get(), max(0.0, end - time.perf_counter()))
            except asyncio.TimeoutError:
                return Event(self.ticket, CANCELLED, finish_reason="cancelled",
                             error="the engine did not answer the abort in time", cached_tokens=self.cached_tokens)
            if event.done:
                return event

    def cancel(self) -> None:
        """The client no longer waits: free the request now (a no-op once it finished)."""
        if not self.finished:
            self.client_gone = True
            self.worker.cancel(self.ticket)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish reason ("stop" or "length"), or None for a run that did not end on its own."""
        if self.last is None or self.last.state != FINISHED or self.timed_out:
            return None
        return self.last.finish_reason

    def failure(self) -> ApiError | None:
        """Why the run ended without finishing, as the error a client is sent; None when it finished."""
        if self.finish_reason is not None:
            return None
        if self.timed_out:
            return ApiError(408, f"the request ran past the server's deadline of {self.worker_deadline_text()}; ask "
                            "for fewer tokens or raise the server's --request-timeout", None, "request_timeout",
                            "timeout_error")
        if self.last is not None and self.last.state == FAILED:
            return ApiError(500, self.last.error or "the engine failed while running this request", None,
                            "engine_error", "server_error")
        assert self.last is None or self.last.state == CANCELLED
        return ApiError(503, "the request was ended before it finished (the server is shutting down)", None,
                        "cancelled", "server_error")

    def worker_deadline_text(self) -> str:
        return f"{self.deadline - self.arrived:.0f} s" if self.deadline is not None else "none"

    def usage(self) -> dict:
        n = self.completion_tokens
        ttft = self.first_s or 0.0
        tpot = (self.last_s - self.first_s) / (n - 1) if n > 1 and self.first_s is not None else 0.0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": min(self.cached_tokens, self.prompt_tokens)},
                "ttft_s": round(ttft, 6), "tpot_s": round(tpot, 6)}


# -- shapes ---------------------------------------------------------------------------------------------------
def completion_logprobs(tokenizer, events: list[Event], offset: int) -> dict:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events:
        if e.token is None:
            continue
        piece = token_text(tokenizer, e.token)
        out["tokens"].append(piece)
        out["token_logprobs"].append(e.logprob)
        out["top_logprobs"].append({token_text(tokenizer, t): lp for t, lp in (e.top or [])} if e.top else None)
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def chat_logprobs(tokenizer, events: list[Event]) -> dict:
    def entry(token, lp):
        piece = token_text(tokenizer, token)
        return {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8"))}

    return {"content": [{**entry(e.token, e.logprob), "top_logprobs": [entry(t, lp) for t, lp in (e.top or [])]}
                        for e in events if e.token is not None]}


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def collect(run: Run) -> tuple[str, list[Event]]:
    """Wait for the whole completion; returns its text and token events."""
    parts, events = [], []
    while not run.finished:
        event = await run.next()
        parts.append(event.text)
        events.append(event)
    return "".join(parts), events


def sse_error(err: ApiError) -> bytes:
    return sse(err.body())


async def stream_completion(run: Run, rid: str, include_usage: bool, on_done):
    try:
        offset = 0
        while not run.finished:
            event = await run.next()
            delta = event.text
            if run.finished and run.failure() is not None:
                if delta:  # text the last token made safe is still the client's
                    yield sse({"id": rid, "object": "text_completion", "created": run.created,
                               "model": run.served.name, "choices": [{"index": 0, "text": delta, "logprobs": None,
                                                                      "finish_reason": None}]})
                yield sse_error(run.failure())
                yield b"data: [DONE]\n\n"
                return
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None}
            if run.want_logprobs and event.token is not None:
                choice["logprobs"] = completion_logprobs(run.served.tokenizer, [event], offset)
            offset += len(delta)
            if run.finished:
                choice["finish_reason"] = run.finish_reason
            chunk = {"id": rid, "object": "text_completion", "created": run.created, "model": run.served.name,
                     "choices": [choice]}
            if include_usage:
                chunk["usage"] = None
            yield sse(chunk)
        if include_usage:
            yield sse({"id": rid, "object": "text_completion", "created": run.created, "model": run.served.name,
                       "choices": [], "usage": run.usage()})
        yield b"data: [DONE]\n\n"
    finally:
        run.cancel()
        on_done(run)


async def stream_chat(run: Run, rid: str, include_usage: bool, on_done):
    try:
        base = {"id": rid, "object": "chat.completion.chunk", "created": run.created, "model": run.served.name}
        first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]}
        if include_usage:
            first["usage"] = None
        yield sse(first)
        while not run.finished:
            event = await run.next()
            delta = event.text
            if run.finished and run.failure() is not None:
                if delta:
                    yield sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": None,
                                                    "finish_reason": None}]})
                yield sse_error(run.failure())
                yield b"data: [DONE]\n\n"
                return
            choice = {"index": 0, "delta": {"content": delta} if delta else {}, "logprobs": None,
                      "finish_reason": run.finish_reason if run.finished else None}
            if run.want_logprobs and event.token is not None:
                choice["logprobs"] = chat_logprobs(run.served.tokenizer, [event])
            chunk = {**base, "choices": [choice]}
            if include_usage:
                chunk["usage"] = None
            yield sse(chunk)
        if include_usage:
            yield sse({**base, "choices": [], "usage": run.usage()})
        yield b"data: [DONE]\n\n"
    finally:
        run.cancel()
        on_done(run)

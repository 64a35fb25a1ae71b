"""One request's life on the server: checked, submitted to the engine thread, its tokens turned into text
and into OpenAI-shaped responses (one JSON body, or server-sent events ending with ``data: [DONE]``).

Text is produced incrementally and held back while it could still be wrong: a UTF-8 character split across
tokens (the decoder shows U+FFFD until it is complete) and any tail that could be the start of a stop string
(so ``"\\nUser:"`` never leaks its ``"\\n"`` before the stop is seen). Every token still gets its own event,
even with empty text, so a client sees each token's arrival (the page's timeline needs it).

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

from attnlab.engine.sampling import SamplingParams
from attnlab.engine.scheduler import Event, Sequence
from attnlab.engine.stops import StopChecker
from attnlab.serve.protocol import ApiError
from attnlab.serve.worker import Draining, QueueFull


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


class TextStream:
    """Token ids in, safe-to-show text deltas out, in O(1) per token.

    Incremental detokenization (as vLLM and HF's TextStreamer do it): only the newest tokens are decoded, with
    a few tokens before them as context (a SentencePiece "▁word" decodes differently at the start of a string
    than after other text), and the difference is the new text; decoding the whole text per token made a long
    answer's streaming quadratic."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self._prefix = self._read = 0  # ids[_prefix:_read] is the context whose text is already decoded
        self.pending = ""  # decoded but not yet sent: held back while it could begin a stop string
        self.sent_chars = 0
        self.stopped = False

    def _decode_new(self, final: bool) -> str:
        ids, decode = self.ids, self.tokenizer.decode_text
        before = decode(ids[self._prefix:self._read])
        after = decode(ids[self._prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):  # wait for a split character
            self._prefix, self._read = self._read, len(ids)
            return after[len(before):]
        return ""

    def push(self, token: int, final: bool) -> str:
        """The text this token makes safe to send. Only the unsent tail is searched: a stop string never begins
        inside text already sent, because any tail that could begin one is held back."""
        if self.tokenizer is None or self.stopped:
            return ""
        if token >= 0:
            self.ids.append(token)
        if token >= 0 or (final and self._read < len(self.ids)):
            self.pending += self._decode_new(final)
        text = self.pending
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            delta, self.pending, self.stopped = text[:cut], "", True
        elif final:
            delta, self.pending = text, ""
        else:
            keep = self._stop_prefix(text)
            delta, self.pending = text[:len(text) - keep], text[len(text) - keep:]
        self.sent_chars += len(delta)
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest tail of text that is the beginning of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

def token_text(tokenizer, token: int) -> str:
    return tokenizer.decode_text([token]) if tokenizer is not None else f"token_id:{token}"


class Run:
    """A submitted request: its sequence, the queue its events arrive on, and its timings."""

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
        stopper = StopChecker(stop_tokens, stops, served.tokenizer)
        self.seq = Sequence(ids, max_tokens, params, stopper, top_logprobs=top_logprobs or 0, cache_salt=cache_salt)
        self.deadline = None if deadline_s is None else self.arrived + deadline_s
        self.timed_out = False
        self.want_logprobs = top_logprobs is not None
        self.text = TextStream(served.tokenizer, stops)
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.finished = False
        self.recorded = False  # its metrics are counted (once, however the request ends)
        self.client_gone = False  # abandoned by its client before it finished (counted as 499)
        try:
            self.worker.submit(self.seq, asyncio.get_running_loop(), self.queue)
        except QueueFull:
            raise ApiError(429, f"the server's queue is full ({self.worker.max_queue} requests waiting); retry "
                           "shortly", None, "queue_full", "rate_limit_error", {"Retry-After": "1"}) from None
        except Draining:
            raise ApiError(503, "the server is shutting down and takes no new requests", None, "shutting_down",
                           "server_error") from None

    async def next(self) -> tuple[Event, str]:
        """The next token event and the text it makes safe to show. Past the request's deadline the run is
        cancelled and ends with a final event (``timed_out`` set)."""
        if self.deadline is None:
            event = await self.queue.get()
        else:
            try:
                event = await asyncio.wait_for(self.queue.get(), max(0.0, self.deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                self.timed_out = True
                self.worker.cancel(self.seq)
                event = Event(self.seq, -1, 0.0, True)
        now = time.perf_counter() - self.arrived
        if event.token >= 0:
            self.first_s = now if self.first_s is None else self.first_s
            self.last_s = now
        self.finished = event.finished
        return event, self.text.push(event.token, event.finished)

    def cancel(self) -> None:
        """The client no longer waits: free the sequence now (a no-op once it finished)."""
        if not self.finished:
            self.client_gone = True
            self.worker.cancel(self.seq)

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish reason ("stop" or "length"), or None for a run that did not end on its own."""
        return self.seq.finish_reason if self.seq.finish_reason in ("stop", "length") and not self.timed_out else None

    def failure(self) -> ApiError | None:
        """Why the run ended without finishing, as the error a client is sent; None when it finished."""
        if self.finish_reason is not None:
            return None
        if self.timed_out:
            return ApiError(408, f"the request ran past the server's deadline of {self.worker_deadline_text()}; ask "
                            "for fewer tokens or raise the server's --request-timeout", None, "request_timeout",
                            "timeout_error")
        if self.seq.finish_reason == "error":
            return ApiError(500, self.seq.error or "the engine failed while running this request", None,
                            "engine_error", "server_error")
        return ApiError(503, "the request was ended before it finished (the server is shutting down)", None,
                        "cancelled", "server_error")

    def worker_deadline_text(self) -> str:
        return f"{self.deadline - self.arrived:.0f} s" if self.deadline is not None else "none"

    def usage(self) -> dict:
        n = len(self.seq.tokens)
        ttft = self.first_s or 0.0
        tpot = (self.last_s - self.first_s) / (n - 1) if n > 1 and self.first_s is not None else 0.0
        return {"prompt_tokens": len(self.seq.prompt), "completion_tokens": n, "total_tokens": len(self.seq.prompt) + n,
                "prompt_tokens_details": {"cached_tokens": min(self.seq.cached_tokens, len(self.seq.prompt))},
                "ttft_s": round(ttft, 6), "tpot_s": round(tpot, 6)}


# -- shapes ---------------------------------------------------------------------------------------------------
def completion_logprobs(tokenizer, events: list[Event], offset: int) -> dict:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events:
        if e.token < 0:
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
                        for e in events if e.token >= 0]}


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


async def collect(run: Run) -> tuple[str, list[Event]]:
    """Wait for the whole completion; returns its text and token events."""
    parts, events = [], []
    while not run.finished:
        event, delta = await run.next()
        parts.append(delta)
        events.append(event)
    return "".join(parts), events


def sse_error(err: ApiError) -> bytes:
    return sse(err.body())


async def stream_completion(run: Run, rid: str, include_usage: bool, on_done):
    try:
        offset = 0
        while not run.finished:
            event, delta = await run.next()
            if run.finished and run.failure() is not None:
                if delta:  # text the last token made safe is still the client's
                    yield sse({"id": rid, "object": "text_completion", "created": run.created,
                               "model": run.served.name, "choices": [{"index": 0, "text": delta, "logprobs": None,
                                                                      "finish_reason": None}]})
                yield sse_error(run.failure())
                yield b"data: [DONE]\n\n"
                return
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": None}
            if run.want_logprobs and event.token >= 0:
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
            event, delta = await run.next()
            if run.finished and run.failure() is not None:
                if delta:
                    yield sse({**base, "choices": [{"index": 0, "delta": {"content": delta}, "logprobs": None,
                                                    "finish_reason": None}]})
                yield sse_error(run.failure())
                yield b"data: [DONE]\n\n"
                return
            choice = {"index": 0, "delta": {"content": delta} if delta else {}, "logprobs": None,
                      "finish_reason": run.finish_reason if run.finished else None}
            if run.want_logprobs and event.token >= 0:
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

"""What goes into the engine and what comes out: a ``Request``, its ``Sequence`` while it runs, and the ``Event``s
its tokens and its end produce (with the whole ``Result`` on the last one).

An event's ``state`` says where the request stands: ``running`` (more tokens will come), ``finished`` (it ended on
its own: a stop, or its length), ``cancelled`` (``Engine.abort``) or ``failed`` (a fault of its own or of its
forward; ``error`` says why in words a client may see). A request's last event is the only one whose state is not
``running``; an event that ends a request without a new token has ``token is None``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence as Seq

import torch

from attnlab.engine.detok import TextStream
from attnlab.engine.sampling import SamplingParams
from attnlab.errors import AttnlabError

RUNNING, FINISHED, CANCELLED, FAILED = "running", "finished", "cancelled", "failed"
STATE_OF = {None: RUNNING, "stop": FINISHED, "length": FINISHED, "cancelled": CANCELLED, "error": FAILED}


class RequestError(AttnlabError):
    """A request the engine refuses before running it; ``field`` and ``code`` let a server answer in its API's
    terms (``code``: "invalid_value", "context_length" or "kv_capacity")."""

    def __init__(self, message: str, field: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.field, self.code = field, code


@dataclass
class Request:
    """One generation: a prompt (token ids, or text for an engine with a tokenizer) and how to continue it."""

    prompt: list[int] | str | bytes
    max_new_tokens: int = 64
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_tokens: Seq[int] = ()
    stop_strings: Seq[str] = ()
    cache_salt: str = ""  # prefix caching: only requests with the same salt share cached prefixes (tenants)
    top_logprobs: int = 0  # alternatives to report per token
    truncate: str | None = None  # "left": keep the prompt's last tokens when prompt + output exceed the context


@dataclass
class Result:
    """Everything a request produced, carried by its last event."""

    prompt_tokens: int
    tokens: list[int]
    logprobs: list[float]
    text: str | None  # the shared detokenizer's text (None without a tokenizer)
    finish_reason: str  # "stop", "length", "cancelled" or "error"
    error: str | None
    cached_tokens: int  # prompt tokens whose keys/values came from a cache instead of a prefill
    stamps_s: list[float]  # since the request was added, when each token existed
    added_s: float  # time.perf_counter() when it was added
    state_bytes: int = 0  # bytes its decode state held at its end (set by the engine)
    proposed: int = 0  # speculative decoding: draft tokens proposed, accepted, verification rounds
    accepted: int = 0
    rounds: int = 0
    preemptions: int = 0  # times it was put back in the queue to be recomputed (the pool ran out of blocks)


@dataclass
class Event:
    """A token that now exists, or a request's end; ``text`` is what this event makes safe to show."""

    id: int
    state: str  # running, finished, cancelled or failed
    token: int | None = None
    logprob: float | None = None
    text: str = ""
    top: list | None = None  # [(token, logprob)] alternatives, when the request asked for them
    finish_reason: str | None = None  # "stop" / "length" (finished), "cancelled", "error" (failed)
    error: str | None = None
    cached_tokens: int = 0
    result: Result | None = None  # on the last event

    @property
    def done(self) -> bool:
        """The request's last event."""
        return self.state != RUNNING


@dataclass
class Sequence:
    """A request while the engine runs it: its prompt, how to sample, and everything produced so far."""

    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    detok: TextStream = field(default_factory=TextStream)  # text and stops
    id: int = 0
    tokens: list[int] = field(default_factory=list)  # generated
    logprobs: list[float] = field(default_factory=list)
    stamps_s: list[float] = field(default_factory=list)  # since submission, when each token existed
    finish_reason: str | None = None  # "stop", "length", "cancelled" or "error"
    error: str | None = None  # with "error": what went wrong, in words a client may see
    cached_tokens: int = 0
    fed: int = 0  # prompt tokens fed to the model so far (prefill progress)
    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    state: object = None  # a one-row state holding the prompt's first tokens (given, or kept after finishing)
    submitted: float = 0.0
    gen: torch.Generator | None = None
    preemptions: int = 0
    cache_salt: str = ""
    top_logprobs: int = 0
    tops: list = field(default_factory=list)  # per token: [(token, logprob)] of the top_logprobs most likely

    @property
    def context(self) -> list[int]:
        """What a prefill must feed: the prompt, or after a preemption everything read but the newest token."""
        return self.prompt + self.tokens[:-1] if self.tokens else self.prompt

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> list[int]:
        return self.prompt + self.tokens

    def append(self, token: int, logprob: float, now_s: float, top: list | None = None) -> Event:
        """Take one generated token: record it, match stops, and say whether the sequence ended."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.stamps_s.append(now_s)
        if top is not None:
            self.tops.append(top)
        delta = self.detok.push(token)
        if self.detok.stopped:
            self.finish_reason = "stop"
        elif len(self.tokens) >= self.max_new_tokens:
            self.finish_reason = "length"
        return self.event(token, logprob, delta, top)

    def end(self, reason: str, error: str | None = None) -> None:
        if not self.done:
            self.finish_reason, self.error = reason, error

    def event(self, token: int | None = None, logprob: float | None = None, text: str = "",
              top: list | None = None) -> Event:
        """The event for what just happened; the last one releases held text and carries the result."""
        state = STATE_OF[self.finish_reason]
        result = None
        if state != RUNNING:
            try:
                text += self.detok.finish()
            except Exception:  # noqa: BLE001 - a failed sequence's held text is best effort (decoding may be its fault)
                if state != FAILED:
                    raise
            if self.finish_reason == "length" and self.detok.cut:  # the stop lay in text held back until now
                self.finish_reason = "stop"
            result = Result(len(self.prompt), list(self.tokens), list(self.logprobs), self.detok.text,
                            self.finish_reason, self.error, self.cached_tokens, list(self.stamps_s), self.submitted,
                            proposed=self.proposed, accepted=self.accepted, rounds=self.rounds,
                            preemptions=self.preemptions)
        return Event(self.id, state, token, logprob, text, top, self.finish_reason if state != RUNNING else None,
                     self.error, self.cached_tokens, result)


def check_prompt(model, prompt: list[int], max_new_tokens: int, truncate: str | None = None,
                 max_len: int | None = None) -> list[int]:
    """Validate a prompt against the model (and an engine's ``max_len``, when smaller than the model's context);
    returns it, left-truncated if asked and needed."""
    if truncate not in (None, "left"):
        raise RequestError(f"truncate={truncate!r}: use None (refuse what does not fit) or 'left'", "truncate")
    if len(prompt) == 0:
        raise RequestError("the prompt is empty; give at least one token of text", "prompt")
    if max_new_tokens <= 0:
        raise RequestError(f"max_new_tokens={max_new_tokens} must be > 0", "max_new_tokens")
    cfg = model.cfg
    vocab = cfg.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"prompt token ids {bad[:3]} are outside the model's vocabulary 0..{vocab - 1}", "prompt")
    if cfg.is_recurrent:
        return list(prompt)
    limit = min(cfg.max_seq_len, max_len or cfg.max_seq_len)
    where = "the model's context" if limit == cfg.max_seq_len else "the engine's max_len"
    if max_new_tokens >= limit:
        raise RequestError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in {where} of "
                           f"{limit} tokens; ask for at most {limit - 1}", "max_new_tokens", "context_length")
    if len(prompt) + max_new_tokens > limit:
        if truncate != "left":
            raise RequestError(f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} exceeds {where} "
                               f"of {limit} tokens; shorten the prompt, lower max_new_tokens, or pass "
                               "--truncate left to keep the prompt's last tokens", "prompt", "context_length")
        prompt = prompt[len(prompt) - (limit - max_new_tokens):]
    return list(prompt)

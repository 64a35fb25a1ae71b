"""The OpenAI-compatible request bodies, checked strictly, and the OpenAI error shape.

Strict means what a client sends is what it gets: ``max_tokens: 1.0``, ``true`` or ``"16"`` is a 400, not
a silently coerced 1 or 16; an unknown field is a 400 naming it (a typo such as ``max_token`` would
otherwise be ignored and the request run with the default). OpenAI fields this server does not implement
are accepted only at their neutral value (``n: 1``, ``presence_penalty: 0``, ``echo: false`` ...), because
client libraries and tools send them by default; any other value is refused by name. Extensions (as in
vLLM): ``top_k``, ``repetition_penalty``, ``ignore_eos``.
"""
from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 1024  # all stop strings together: each token's stop match reads back this far
MAX_TOP_LOGPROBS = 20
MAX_DEPTH = 32  # JSON nesting: the deepest valid body (chat content parts) is 5 levels
MAX_CACHE_SALT = 256
# Extremes that overflow fp32 logits (a penalty of 1e-300 divides them by ~0) are refused before any compute;
# a row that still turns non-finite ends alone in the engine.
REPETITION_PENALTY_RANGE = (1e-2, 1e2)
# top_p > 0, stated as a normal float: the server flushes denormals to zero, so 5e-324 would read as 0 here
MIN_TOP_P = 1e-30


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None  # optional: the one served model answers; another name is a 404
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    top_k: int = 0  # extension: 0 keeps the whole vocabulary
    repetition_penalty: float = 1.0  # extension
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # extension: generate max_tokens tokens even past the end-of-text token
    n: int = 1
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    cache_salt: str | None = None  # extension (as vLLM): only requests with the same salt share cached prefixes

    def check(self) -> None:
        """What pydantic's types cannot say: ranges, NaN, and unsupported values of known fields."""
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= 2):
            raise ApiError(400, f"temperature={self.temperature} must be a number in [0, 2] (0 is greedy)",
                           "temperature", "invalid_value")
        if not (math.isfinite(self.top_p) and MIN_TOP_P <= self.top_p <= 1):
            raise ApiError(400, f"top_p={self.top_p} must be in [{MIN_TOP_P:g}, 1] (1 keeps the whole vocabulary)",
                           "top_p", "invalid_value")
        if self.top_k < 0:
            raise ApiError(400, f"top_k={self.top_k} must be >= 0 (0 keeps the whole vocabulary)", "top_k",
                           "invalid_value")
        lo, hi = REPETITION_PENALTY_RANGE
        if not (math.isfinite(self.repetition_penalty) and lo <= self.repetition_penalty <= hi):
            raise ApiError(400, f"repetition_penalty={self.repetition_penalty} must be in [{lo:g}, {hi:g}] (1 disables "
                           "it; values beyond overflow the model's scores)", "repetition_penalty", "invalid_value")
        if self.cache_salt is not None and not 0 < len(self.cache_salt) <= MAX_CACHE_SALT:
            raise ApiError(400, f"cache_salt must be 1 to {MAX_CACHE_SALT} characters", "cache_salt", "invalid_value")
        if self.n != 1:
            raise ApiError(400, f"n={self.n}: this server returns one choice per request; send n=1 (or omit "
                           "it) and make several requests", "n", "unsupported_value")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise ApiError(400, f"{name} is not supported (only 0); use repetition_penalty instead", name,
                               "unsupported_value")
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported (only empty or null)", "logit_bias",
                           "unsupported_value")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream=true", "stream_options",
                           "invalid_value")
        if self.seed is not None and not 0 <= self.seed < 2 ** 63:
            raise ApiError(400, f"seed={self.seed} must be in [0, 2**63)", "seed", "invalid_value")

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise ApiError(400, f"{len(stops)} stop sequences given; at most {MAX_STOP}", "stop", "invalid_value")
        if sum(map(len, stops)) > MAX_STOP_CHARS:
            raise ApiError(400, f"the stop sequences hold {sum(map(len, stops))} characters together; at most "
                           f"{MAX_STOP_CHARS}", "stop", "invalid_value")
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[int]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None  # the top-N alternatives per token (0: only the chosen token's logprob)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check(self) -> None:
        super().check()
        if self.logprobs is not None and not 0 <= self.logprobs <= 5:
            raise ApiError(400, f"logprobs={self.logprobs} must be in [0, 5] (OpenAI's limit)", "logprobs",
                           "invalid_value")
        if self.echo:
            raise ApiError(400, "echo is not supported", "echo", "unsupported_value")
        if self.best_of not in (None, 1):
            raise ApiError(400, f"best_of={self.best_of} is not supported (only 1)", "best_of", "unsupported_value")
        if self.suffix:
            raise ApiError(400, "suffix (insertion) is not supported", "suffix", "unsupported_value")

    @property
    def top_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    name: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[Message]
    max_tokens: int | None = None  # OpenAI's default: as many as the context leaves
    max_completion_tokens: int | None = None  # OpenAI's newer name for the same limit
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None)

    def check(self) -> None:
        super().check()
        if not self.messages:
            raise ApiError(400, "messages is empty; send at least one message", "messages", "invalid_value")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ApiError(400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens",
                           "invalid_value")
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise ApiError(400, "top_logprobs needs logprobs=true", "top_logprobs", "invalid_value")
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                raise ApiError(400, f"top_logprobs={self.top_logprobs} must be in [0, {MAX_TOP_LOGPROBS}]",
                               "top_logprobs", "invalid_value")

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_body(raw: bytes, model_cls):
    """Raw request bytes -> a checked request, or ApiError(400) naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 ({e}); send UTF-8 encoded JSON", None,
                       "invalid_encoding") from None

    def no_constant(name):  # NaN / Infinity are not JSON, and no field accepts them
        raise ValueError(f"{name} is not valid JSON")

    depth = _nesting(text)
    if depth > MAX_DEPTH:
        raise ApiError(400, f"the request body nests {depth} levels deep; at most {MAX_DEPTH}", None, "invalid_json")
    try:
        data = json.loads(text, parse_constant=no_constant)
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})", None, "invalid_json") from None
    where = _lone_surrogate(data)
    if where is not None:
        raise ApiError(400, f"{where or 'the body'} holds a lone UTF-16 surrogate (an escape such as \\ud800 with no "
                       "pair); text must be valid Unicode", where or None, "invalid_encoding")
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(data).__name__}", None,
                       "invalid_json")
    try:
        req = model_cls.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e, model_cls) from None
    req.check()
    return req


def _nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in a JSON text, outside strings (counted before parsing, since a
    deep enough body overflows the parser's recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _lone_surrogate(obj, path: str = "") -> str | None:
    """The path of the first string (key or value) holding an unpaired surrogate, else None."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        sub = f"{path}.{k}" if path else str(k)
        if isinstance(k, str) and _lone_surrogate(k, sub) is not None:
            return sub
        found = _lone_surrogate(v, sub)
        if found is not None:
            return found
    return None


def _validation_error(e: ValidationError, model_cls) -> ApiError:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"] if not (isinstance(x, str) and ("[" in x or x in ("str", "int")))]
    param = ".".join(loc) or None
    if err["type"] == "extra_forbidden":
        known = ", ".join(sorted(model_cls.model_fields))
        return ApiError(400, f"unknown field {param!r}; this endpoint accepts: {known}", param, "unknown_field")
    if err["type"] == "missing":
        return ApiError(400, f"{param!r} is required", param, "missing_field")
    got = err.get("input")
    shown = json.dumps(got)[:80] if not isinstance(got, (dict, list)) else type(got).__name__
    return ApiError(400, f"{param}: {err['msg'].lower()} (got {shown}); types are strict: no numbers in strings, "
                    "no floats or booleans for integers", param, "invalid_type")

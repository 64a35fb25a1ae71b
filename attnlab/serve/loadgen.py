"""A load generator for any OpenAI-compatible ``/v1/completions`` server (``attnlab bench serve``).

    spec = LoadSpec(requests=16, concurrency=4, prompt_len=Lengths.parse("128"), output_len=Lengths.parse("64"))
    summary = run_load("http://127.0.0.1:8000", spec)   # a dict: counts, tok/s, TTFT/TPOT/ITL percentiles

Arrivals: ``rate`` (Poisson, open loop: request i is sent at the sum of i exponential gaps drawn from a seeded
RNG, whether or not earlier ones finished) or ``concurrency`` (closed loop: N clients, each sending its next
request when its last one ends). Prompts are random token ids below ``vocab`` (lengths from ``prompt_len``)
or given texts / id lists; every request streams with temperature 0 and ``ignore_eos`` so it produces exactly
``max_tokens`` tokens. One SSE chunk is one token (attnlab sends a chunk per token even when its text is
empty); the server's own usage (with its token count) is kept beside the client's figures.

Every time is the client's ``time.perf_counter`` since the run's start: TTFT = send -> first token chunk;
ITL = each gap between two token chunks; TPOT = (last - first token) / (tokens - 1); end-to-end = send ->
the stream's end.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field

import httpx

LENGTH_KINDS = ("fixed", "uniform", "lognormal")
DEFAULT_VOCAB = 256  # random ids stay below this when the server does not report its vocabulary


@dataclass(frozen=True)
class Lengths:
    """Token counts: ``fixed`` lo; ``uniform`` integers in [lo, hi]; ``lognormal`` round(lo * exp(sigma * z)),
    z standard normal (lo is the median), clipped to [1, hi]."""

    kind: str = "fixed"
    lo: int = 128
    hi: int = 128
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"length kind {self.kind!r} is not one of {', '.join(LENGTH_KINDS)}")
        if self.lo < 1 or self.hi < self.lo:
            raise ValueError(f"lengths need 1 <= lo <= hi, got lo={self.lo}, hi={self.hi}")
        if self.kind == "lognormal" and not self.sigma > 0:
            raise ValueError(f"a lognormal length needs sigma > 0, got {self.sigma}")

    @classmethod
    def parse(cls, text: str, name: str = "length") -> "Lengths":
        """'128' fixed; '64:512' uniform in [64, 512]; 'lognormal:128:0.5[:1024]' median 128, sigma 0.5, at most
        1024 (default 8x the median)."""
        parts = text.split(":")
        try:
            if len(parts) == 1:
                return cls("fixed", int(parts[0]), int(parts[0]))
            if len(parts) == 2:
                return cls("uniform", int(parts[0]), int(parts[1]))
            if parts[0] == "lognormal" and len(parts) in (3, 4):
                median = int(parts[1])
                return cls("lognormal", median, int(parts[3]) if len(parts) == 4 else 8 * median, float(parts[2]))
        except ValueError as e:
            raise ValueError(f"--{name} {text!r}: {e}") from None
        raise ValueError(f"--{name} {text!r}: give N (fixed), LO:HI (uniform) or lognormal:MEDIAN:SIGMA[:MAX]")

    def draw(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.lo
        if self.kind == "uniform":
            return rng.randint(self.lo, self.hi)
        return min(self.hi, max(1, round(self.lo * math.exp(self.sigma * rng.gauss(0.0, 1.0)))))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.lo}"
        if self.kind == "uniform":
            return f"uniform integers in [{self.lo}, {self.hi}]"
        return f"lognormal, median {self.lo}, sigma {self.sigma}, clipped to [1, {self.hi}]"


@dataclass
class LoadSpec:
    """What to send and when. Exactly one of ``rate`` (Poisson, req/s) and ``concurrency`` (closed loop)."""

    requests: int = 16
    rate: float | None = None
    concurrency: int | None = None
    prompt_len: Lengths = field(default_factory=lambda: Lengths("fixed", 128, 128))
    output_len: Lengths = field(default_factory=lambda: Lengths("fixed", 64, 64))
    prompts: list | None = None  # texts or token-id lists, used in turn instead of random ids
    vocab: int | None = None  # random ids are < vocab; None: the server's vocab_size (/api/info), else 256
    seed: int = 0
    warmup: int = 0  # untimed requests sent one at a time first (their own random prompts)
    api_key: str | None = None
    model: str | None = None  # the "model" field; None: omitted (attnlab serves one model)
    timeout_s: float = 600.0  # per request
    keep_token_times: bool = False  # per_request rows carry every token's arrival time

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise ValueError(f"requests={self.requests} must be >= 1")
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate (Poisson arrivals, req/s) and concurrency (closed loop)")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"rate={self.rate} must be a positive number of requests per second")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be >= 1")
        if self.vocab is not None and self.vocab < 1:
            raise ValueError(f"vocab={self.vocab} must be >= 1")
        if self.prompts is not None and not self.prompts:
            raise ValueError("prompts is an empty list; give at least one, or None for random token ids")
        if self.warmup < 0:
            raise ValueError(f"warmup={self.warmup} must be >= 0")

    def describe(self) -> dict:
        """The stated settings, as every result records them."""
        out = {k: v for k, v in asdict(self).items() if k not in ("prompts", "api_key", "prompt_len", "output_len")}
        out["arrivals"] = (f"poisson, {self.rate} req/s (exponential gaps, seed {self.seed})" if self.rate
                           else f"closed loop, {self.concurrency} clients sending back to back")
        out["prompt_len"] = ("given prompts, in turn" if self.prompts is not None else
                             self.prompt_len.describe() + " random token ids")
        out["output_len"] = self.output_len.describe() + " tokens (ignore_eos, temperature 0)"
        return out


@dataclass
class Request:
    prompt: list[int] | str
    max_tokens: int


def make_requests(spec: LoadSpec, vocab: int, n: int | None = None, stream: str = "timed") -> list[Request]:
    """The spec's requests, the same for the same seed and stream name ('timed', 'warmup', ...)."""
    rng = random.Random(f"{stream}-{spec.seed}")
    out = []
    for i in range(spec.requests if n is None else n):
        if spec.prompts is not None and stream == "timed":
            prompt = spec.prompts[i % len(spec.prompts)]
        else:
            prompt = [rng.randrange(vocab) for _ in range(spec.prompt_len.draw(rng))]
        out.append(Request(prompt, spec.output_len.draw(rng)))
    return out


@dataclass
class RequestResult:
    """One request as the client saw it; times in seconds since the run's start."""

    index: int
    prompt_tokens: int | None  # None for a text prompt (the usage says)
    max_tokens: int
    sent_s: float
    end_s: float = 0.0
    status: int | None = None  # HTTP status; None when no response came
    error: str | None = None
    finish_reason: str | None = None
    token_s: list[float] = field(default_factory=list)
    usage: dict | None = None
    finished: bool = False  # the stream's data: [DONE] arrived

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and bool(self.token_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_s[0] - self.sent_s if self.token_s else None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.token_s, self.token_s[1:])]

    @property
    def tpot_s(self) -> float | None:
        n = len(self.token_s)
        return (self.token_s[-1] - self.token_s[0]) / (n - 1) if n > 1 else None

    def failure(self) -> str | None:
        """'400', 'ReadTimeout', 'finish_error', ... or None when the request succeeded."""
        if self.ok:
            return None
        if self.status is not None and self.status != 200:
            return str(self.status)
        if self.error:
            return self.error.split(":")[0]
        return "no_tokens"

    def to_dict(self, keep_token_times: bool = False) -> dict:
        out = {"index": self.index, "prompt_tokens": self.prompt_tokens, "max_tokens": self.max_tokens,
               "sent_s": self.sent_s, "end_s": self.end_s, "status": self.status, "error": self.error,
               "finish_reason": self.finish_reason, "output_tokens": len(self.token_s), "ttft_s": self.ttft_s,
               "tpot_s": self.tpot_s, "e2e_s": self.end_s - self.sent_s,
               "max_itl_s": max(self.itl_s, default=None), "usage": self.usage}
        if keep_token_times:
            out["token_s"] = self.token_s
        return out


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def stream_request(client: httpx.AsyncClient, base_url: str, req: Request, t0: float, index: int = 0,
                         api_key: str | None = None, model: str | None = None, on_token=None) -> RequestResult:
    """Send one streaming completion and time its tokens; never raises for HTTP or network errors (recorded).
    ``on_token(result)`` is called after each token arrives."""
    body = {"prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    res = RequestResult(index, len(req.prompt) if isinstance(req.prompt, list) else None, req.max_tokens,
                        time.perf_counter() - t0)
    try:
        async with client.stream("POST", base_url.rstrip("/") + "/v1/completions", json=body,
                                 headers=_headers(api_key)) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                raw = await resp.aread()
                try:
                    res.error = f"http: {json.loads(raw)['error']['message']}"
                except (ValueError, KeyError, TypeError):
                    res.error = f"http: {raw[:200].decode('utf-8', 'replace')}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter() - t0
                payload = line[5:].strip()
                if payload == "[DONE]":
                    res.finished = True
                    break
                chunk = json.loads(payload)
                if chunk.get("error"):
                    res.error = f"stream: {chunk['error']}"
                    break
                if chunk.get("usage"):
                    res.usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    reason = choice.get("finish_reason")
                    res.finish_reason = reason or res.finish_reason
                    if reason in ("cancelled", "error", "abort"):  # a final event without a token
                        res.error = f"finish_{reason}: the stream ended without a token"
                        continue
                    res.token_s.append(now)
                    if on_token is not None:
                        on_token(res)
            if not res.finished and res.error is None:
                res.error = "incomplete_stream: the stream ended before data: [DONE]"
    except (httpx.HTTPError, OSError, ValueError) as e:  # network, timeout, malformed stream
        res.error = f"{type(e).__name__}: {e}"
    finally:
        res.end_s = time.perf_counter() - t0
    return res


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def distribution(values: list[float]) -> dict:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95), "p99": percentile(values, 99),
            "mean": sum(values) / len(values) if values else None, "max": max(values, default=None), "n": len(values)}


def summarize(results: list[RequestResult], keep_token_times: bool = False) -> dict:
    """Counts, throughput and latency percentiles of finished requests (wall = first send -> last end)."""
    ok = [r for r in results if r.ok]
    failed: dict[str, int] = {}
    for r in results:
        key = r.failure()
        if key is not None:
            failed[key] = failed.get(key, 0) + 1
    start = min((r.sent_s for r in results), default=0.0)
    wall_s = max((r.end_s for r in results), default=0.0) - start
    out_tokens = sum(len(r.token_s) for r in ok)
    itl = [g for r in ok for g in r.itl_s]
    usage = [r.usage for r in ok if r.usage]
    return {
        "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok), "failed_by": failed,
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s, "output_tokens": out_tokens,
        "output_tok_per_s": out_tokens / wall_s if wall_s > 0 else 0.0,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
        "mean_in_flight": sum(r.end_s - r.sent_s for r in results) / wall_s if wall_s > 0 else 0.0,
        "ttft_s": distribution([r.ttft_s for r in ok]),
        "tpot_s": distribution([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_s": distribution([r.end_s - r.sent_s for r in ok]),
        "itl_s": distribution(itl), "max_itl_s": max(itl, default=None),
        "server_usage": {"ttft_s": distribution([u["ttft_s"] for u in usage if "ttft_s" in u]),
                         "tpot_s": distribution([u["tpot_s"] for u in usage if "tpot_s" in u]),
                         "cached_tokens": sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                                              for u in usage),
                         "token_count_mismatches": sum(u.get("completion_tokens") != len(r.token_s)
                                                       for r, u in ((r, r.usage) for r in ok if r.usage))},
        "per_request": [r.to_dict(keep_token_times) for r in results],
    }


def new_client(timeout_s: float = 600.0) -> httpx.AsyncClient:
    """No connection cap (an open-loop run must not queue in the client) and no proxies from the environment
    (the server is measured directly)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0), trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))


async def fetch_info(client: httpx.AsyncClient, base_url: str, api_key: str | None) -> dict | None:
    """attnlab's /api/info (context, max_batch, prefill_chunk, ...); None from a server without it."""
    try:
        resp = await client.get(base_url.rstrip("/") + "/api/info", headers=_headers(api_key))
        return resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def run_load_async(base_url: str, spec: LoadSpec) -> dict:
    async with new_client(spec.timeout_s) as client:
        info = await fetch_info(client, base_url, spec.api_key)
        vocab = spec.vocab or (info or {}).get("vocab_size") or DEFAULT_VOCAB
        send = dict(api_key=spec.api_key, model=spec.model)
        for i, req in enumerate(make_requests(spec, vocab, spec.warmup, "warmup")):
            await stream_request(client, base_url, req, time.perf_counter(), i, **send)
        requests = make_requests(spec, vocab)
        t0 = time.perf_counter()
        if spec.rate is not None:
            rng, at, tasks = random.Random(f"arrivals-{spec.seed}"), 0.0, []
            for i, req in enumerate(requests):
                at += rng.expovariate(spec.rate)
                await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
                tasks.append(asyncio.ensure_future(stream_request(client, base_url, req, t0, i, **send)))
            results = list(await asyncio.gather(*tasks))
        else:
            todo = list(enumerate(requests))[::-1]
            results = []

            async def one_client() -> None:
                while todo:
                    i, req = todo.pop()
                    results.append(await stream_request(client, base_url, req, t0, i, **send))

            await asyncio.gather(*(one_client() for _ in range(min(spec.concurrency, len(requests)))))
            results.sort(key=lambda r: r.index)
    summary = summarize(results, spec.keep_token_times)
    return {"url": base_url, "server": info, "vocab": vocab, "spec": spec.describe(), **summary}


def run_load(base_url: str, spec: LoadSpec) -> dict:
    """Run the load and return its summary (see ``summarize``); blocks until every request ended."""
    return asyncio.run(run_load_async(base_url, spec))

"""A soak of `attnlab serve`: minutes of mixed load at 16-64 clients with hostile requests mixed in.

    python benchmarks/serve_soak.py [--minutes 10] [--clients 16,64] [--threads 2] [--quick]

One HF folder (a small GPT-2-shaped model, random weights, seed 0, no tokenizer: prompts are token ids) is served
by `attnlab serve` in its own process on loopback, with a small queue so that bursts go past it. The load comes
from this process: phases of N closed-loop clients (N cycling through --clients), each client drawing its next
request from a fixed mix:

- good greedy requests (one of 8 reference prompts, streamed or not), whose text must equal the same request
  run alone on the idle server before the soak;
- sampled requests (temperature, top-k, top-p, a repetition penalty);
- hostile bodies: lone surrogates, deep nesting, a text/plain POST, a foreign Origin, overflowing penalties,
  wrong types, invalid JSON, max_tokens past the cap;
- streams the client leaves mid-way, and bursts of 2 x the queue sent at once (429s expected).

The loops are bounded by time and by count and talk only to 127.0.0.1. After a warm-up (one short phase), the
server is left to go idle and its resident memory read as the baseline. At the end: KV blocks in use (must be 0),
resident memory against the baseline (within 10%), the count of 5xx answers (must be 0), and every good greedy
answer equal to its reference. Writes benchmarks/results/serve_soak.json with the machine context.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import context, set_threads, write_json  # noqa: E402

from attnlab.serve.launch import LaunchedServer  # noqa: E402

MODEL = dict(vocab_size=2048, dim=256, n_layers=4, n_heads=4, max_seq_len=512)
QUICK_MODEL = dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, max_seq_len=256)
QUEUE = 48
HOSTILE = [  # (raw body, extra headers): each must get a 4xx in OpenAI's shape
    (b'{"prompt": "\\ud800", "max_tokens": 4}', {}),
    (b'{"prompt": [1, 2], "stop": ["\\udc00"]}', {}),
    (b"[" * 50_000, {}),
    (b'{"prompt": [1, 2, 3], "max_tokens": 4}', {"content-type": "text/plain"}),
    (b'{"prompt": [1, 2, 3], "max_tokens": 4}', {"origin": "http://evil.example"}),
    (b'{"prompt": [1, 2, 3], "temperature": 1, "repetition_penalty": 1e-300}', {}),
    (b'{"prompt": [1, 2, 3], "max_tokens": 1e9}', {}),
    (b'{"prompt": [1, 2, 3], "max_tokens": "4"}', {}),
    (b'{"prompt": [1, 2, 3], ', {}),
    (b'{"prompt": [1, 2, 3], "max_tokens": 100000}', {}),
    (b'{"prompt": "text needs a tokenizer", "max_tokens": 4}', {}),
]


def build_folder(model: dict, folder: str) -> None:
    from attnlab.config import preset
    from attnlab.models import build_model
    from attnlab.models.hf import save_hf

    torch.manual_seed(0)
    save_hf(build_model(preset("gpt2", **model)).eval(), folder)


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class Soak:
    def __init__(self, url: str, vocab: int, seed: int = 0):
        self.url, self.vocab = url, vocab
        self.rng = random.Random(seed)
        self.refs = [[self.rng.randrange(vocab) for _ in range(self.rng.randrange(16, 96))] for _ in range(8)]
        self.expected: dict[int, str] = {}
        self.status: Counter = Counter()
        self.kinds: Counter = Counter()
        self.mismatches: list[dict] = []
        self.errors: list[str] = []
        self.transport: Counter = Counter()

    async def greedy(self, client, i: int, stream: bool) -> tuple[int, str]:
        body = {"prompt": self.refs[i], "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": stream}
        if not stream:
            r = await client.post(self.url + "/v1/completions", json=body)
            return r.status_code, (r.json()["choices"][0]["text"] if r.status_code == 200 else "")
        text, status = [], 0
        async with client.stream("POST", self.url + "/v1/completions", json=body) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return 500, ""  # a stream that failed: counted as a server error
                    text += [c["text"] for c in chunk["choices"]]
        return status, "".join(text)

    async def references(self, client) -> None:
        for i in range(len(self.refs)):
            status, text = await self.greedy(client, i, False)
            if status != 200:
                raise RuntimeError(f"reference request {i} failed with {status}")
            self.expected[i] = text

    async def one(self, client) -> None:
        kind = self.rng.choices(["greedy", "stream", "sampled", "hostile", "leave"], [4, 3, 2, 3, 1])[0]
        self.kinds[kind] += 1
        try:
            if kind in ("greedy", "stream"):
                i = self.rng.randrange(len(self.refs))
                status, text = await self.greedy(client, i, kind == "stream")
                if status == 200 and text != self.expected[i]:
                    self.mismatches.append({"prompt": i, "kind": kind})
            elif kind == "sampled":
                body = {"prompt": self.refs[self.rng.randrange(8)] + [self.rng.randrange(self.vocab)],
                        "max_tokens": self.rng.randrange(1, 48), "temperature": 0.9, "top_k": 40, "top_p": 0.95,
                        "repetition_penalty": 1.2, "seed": self.rng.randrange(1 << 30)}
                status = (await client.post(self.url + "/v1/completions", json=body)).status_code
            elif kind == "hostile":
                raw, headers = self.rng.choice(HOSTILE)
                r = await client.post(self.url + "/v1/completions", content=raw,
                                      headers={"content-type": "application/json", **headers})
                status = r.status_code
                if not 400 <= status < 500 or "error" not in r.json():
                    self.errors.append(f"hostile body answered {status}: {r.text[:120]}")
            else:  # leave mid-stream
                body = {"prompt": self.refs[0], "max_tokens": 200, "ignore_eos": True, "stream": True}
                async with client.stream("POST", self.url + "/v1/completions", json=body) as r:
                    status = r.status_code
                    async for n, _ in _enumerate(r.aiter_lines()):
                        if n >= self.rng.randrange(2, 12):
                            break
        except httpx.HTTPError as e:  # the client's side: kept apart by kind, since a dropped connection is a fault
            status = type(e).__name__
            self.transport[f"{kind}: {status}"] += 1
        self.status[str(status)] += 1

    async def burst(self, client, n: int) -> None:
        body = {"prompt": self.refs[1], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        rs = await asyncio.gather(*[client.post(self.url + "/v1/completions", json=body) for _ in range(n)],
                                  return_exceptions=True)
        for r in rs:
            if not isinstance(r, httpx.Response):
                self.transport[f"burst: {type(r).__name__}"] += 1
            self.status[str(r.status_code if isinstance(r, httpx.Response) else type(r).__name__)] += 1
        self.kinds["burst"] += n

    async def phase(self, clients: int, seconds: float, max_requests: int) -> None:
        deadline = time.monotonic() + seconds
        sent = 0
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=120, trust_env=False, limits=limits) as client:
            async def worker():
                nonlocal sent
                while time.monotonic() < deadline and sent < max_requests:
                    sent += 1
                    await self.one(client)

            await asyncio.gather(*[worker() for _ in range(clients)], self.burst(client, 2 * QUEUE))


async def _enumerate(aiter):
    n = 0
    async for x in aiter:
        yield n, x
        n += 1


async def wait_idle(url: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        while time.monotonic() < deadline:
            load = (await client.get(url + "/api/load")).json()
            if load["running"] == 0 and load["queued"] == 0 and load.get("kv_blocks_used", 0) == 0:
                await asyncio.sleep(1.0)  # the engine trims its heap once idle
                return load
            await asyncio.sleep(0.2)
        return (await client.get(url + "/api/load")).json()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", default="16,64")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a tiny model for half a minute (a smoke test)")
    p.add_argument("--out")
    args = p.parse_args()
    set_threads(args.threads)
    model = QUICK_MODEL if args.quick else MODEL
    minutes = 0.5 if args.quick else args.minutes
    clients = [int(c) for c in args.clients.split(",")]
    phase_s = 10.0 if args.quick else 60.0
    out = args.out or (str(Path(tempfile.gettempdir()) / "serve_soak.json") if args.quick
                       else "benchmarks/results/serve_soak.json")
    with tempfile.TemporaryDirectory() as folder:
        build_folder(model, folder)
        serve = ["--threads", str(args.threads), "--max-batch", "32", "--max-queue", str(QUEUE),
                 "--max-tokens-cap", "256", "--request-timeout", "120"]
        with LaunchedServer(folder, serve) as server:
            soak = Soak(server.url, model["vocab_size"])
            t0 = time.perf_counter()
            asyncio.run(_references(soak))
            asyncio.run(soak.phase(clients[0], phase_s / 2, 10_000))  # warm-up: every path once
            # the cost model's machine calibration, started with the server, holds GBs of test matrices while it
            # runs: this call waits for it, so the baseline is the server's own memory, not the calibration's
            httpx.get(server.url + "/api/predict?prompt_tokens=8", timeout=600, trust_env=False)
            asyncio.run(wait_idle(server.url))
            rss0 = rss_bytes(server.proc.pid)
            warm = dict(soak.status)
            soak.status.clear()
            start, phases = time.monotonic(), []
            while time.monotonic() - start < minutes * 60:
                n = clients[len(phases) % len(clients)]
                left = minutes * 60 - (time.monotonic() - start)
                asyncio.run(soak.phase(n, min(phase_s, left), 20_000))
                phases.append(n)
            load = asyncio.run(wait_idle(server.url))
            rss1 = rss_bytes(server.proc.pid)
            metrics = httpx.get(server.url + "/metrics", trust_env=False).text
            health = httpx.get(server.url + "/health", trust_env=False).status_code
            wall = time.perf_counter() - t0
    five = {k: v for k, v in soak.status.items() if k.startswith("5")}
    engine_errors = [line for line in metrics.splitlines() if line.startswith("attnlab_engine_")]
    goals = {"kv_blocks_in_use_at_end": load.get("kv_blocks_used", 0) == 0,
             "rss_within_10pct": abs(rss1 - rss0) <= 0.10 * rss0, "zero_5xx": not five,
             "greedy_equal_alone": not soak.mismatches, "hostile_all_4xx": not soak.errors, "healthy": health == 200,
             "no_dropped_connections": not soak.transport}
    result = {"benchmark": "serve_soak", "context": context(0), "model": model, "minutes": minutes,
              "phases": phases, "wall_s": wall, "requests": sum(soak.status.values()), "status": dict(soak.status),
              "warmup_status": warm, "kinds": dict(soak.kinds), "rss_bytes": {"after_warmup": rss0, "end": rss1,
                                                                               "change": (rss1 - rss0) / rss0},
              "load_at_end": load, "engine_counters": engine_errors, "mismatches": soak.mismatches[:20],
              "hostile_errors": soak.errors[:20], "transport_errors": dict(soak.transport), "goals": goals, "all_met": all(goals.values())}
    print(json.dumps({k: result[k] for k in ("requests", "status", "kinds", "transport_errors", "rss_bytes", "goals")}, indent=1))
    print(f"wrote {write_json(out, result)}")


async def _references(soak: Soak) -> None:
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        await soak.references(client)


if __name__ == "__main__":
    main()

"""Serving under load, on GPT-2 small's shape (random weights, seed 0, fp32, 2 threads), all in one run.

    python benchmarks/serve_load.py [--rounds 3] [--threads 2] [--quick]

One HF folder (attnlab's gpt2 preset saved with save_hf) feeds every side. The server is `attnlab serve` in
its own process (--threads, --max-batch, --kv-blocks, --prefill-chunk as in `settings`); the load comes from
attnlab.serve.loadgen in this process, timed by its clock (time.perf_counter).

b. Continuous batching: 16 requests (128-token prompts, 64 output tokens, ignore_eos, greedy) sent at once
   (concurrency 16) vs one at a time (concurrency 1); aggregate output tok/s = tokens / (first send -> last
   stream end). Target >= 4x.
c. HTTP overhead, at 64 clients (Sizes.peers): 64 requests at once through the server vs the engine driven
   directly: the Engine built with the server's settings (paged pool, max_batch, prefill_chunk, tokenizer),
   the 64 requests added, stepped until done in a thread of its own (as the server's engine thread), tokens /
   (submit -> last token). Target >= 90%.
d. The peers, on the same 64 prompts, each at its strongest batched path: Hugging Face's continuous batching
   (hf_continuous.run_hf_generate_batch) and its plain batched generate (hf_continuous.run_hf_generate, the faster
   of the two on prompts that arrive together), each timed on the generation call alone (the wall of the whole
   call is recorded too), and CTranslate2's generate_batch over the same weights (its own converter; skipped
   where CTranslate2 is not installed: pip install -e '.[bench]'). Target: server >= 1.5x the faster HF path in
   the same round; the server's ratio to CTranslate2 is reported. Greedy outputs of the engine, both HF paths and
   CTranslate2 are compared on the same prompts.
   b-d run in rounds, each round in another order. c and d share one fresh prompt set per round: the server, the
   engine and each peer run in processes of their own, so no side can serve another's prompt from its cache.
e. Chunked prefill: 16 streams (128-token prompts, 256 outputs); once every stream has 20 tokens a
   1,000-token prompt (16 outputs) arrives. Longest gap between two tokens of any stream while that prompt is
   prefilled (a gap ending after it was sent and starting before its first token), and p95 TPOT of the 16,
   with --prefill-chunk 0 (whole prompts) and each chunk size; plus one stream alone (single-client TPOT), on
   each server. A fresh server per setting and round, rounds in alternating order. Targets: max gap chunked
   <= 1/4 of unchunked; p95 TPOT chunked <= 3x single-client TPOT.
f. The load table: 1, 4, 16, 64 clients, closed loop (N clients back to back) and Poisson arrivals at
   rate = N / the closed loop's mean end-to-end latency (Little's law: about N in flight on average; the
   achieved mean in flight is reported); throughput, TTFT / TPOT / end-to-end percentiles, errors.

Every timed run uses fresh random prompts (its own seed; the lengths are the same; each prompt's first token
unused by any earlier one) because the server's prefix cache would serve a repeated prompt, or even a shared
first token, from cache; the cached tokens each side reports are recorded (0 expected).
Every path is warmed up before timing. Writes benchmarks/results/serve_load.json (--quick: a tiny model and a
few requests, for a smoke test; written to the temp folder unless --out is given).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import context, matmul_peak_flops, memory_bandwidth, set_threads, summarize, write_json  # noqa: E402

from serve_sides import PEERS, SideProcess, peer_missing  # noqa: E402

from attnlab.serve.launch import LaunchedServer  # noqa: E402
from attnlab.serve.loadgen import (Lengths, LoadSpec, Request, make_requests, new_client, percentile,  # noqa: E402
                                   run_load, stream_request)


@dataclass
class Sizes:
    model: dict  # preset("gpt2", **model)
    max_batch: int
    kv_blocks: int
    n: int = 16  # b: requests
    peers: int = 64  # c-d: requests at once
    prompt: int = 128
    out: int = 64
    streams: int = 16  # e
    stream_prompt: int = 128
    stream_out: int = 256
    trigger: int = 20  # tokens every stream has before the long prompt arrives
    long_prompt: int = 1000
    long_out: int = 16
    chunks: tuple = (128, 256)
    clients: tuple = (1, 4, 16, 64)  # f
    min_requests: int = 16  # f: requests per row = max(min_requests, 2N)


FULL = Sizes(model={}, max_batch=64, kv_blocks=1024)
QUICK = Sizes(model=dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, max_seq_len=256), max_batch=8, kv_blocks=128,
              n=4, peers=6, prompt=32, out=16, streams=4, stream_prompt=32, stream_out=48, trigger=8, long_prompt=232,
              long_out=8, chunks=(32, 64), clients=(1, 4), min_requests=4)


def build_folder(sz: Sizes, folder: str) -> dict:
    from attnlab.config import preset
    from attnlab.models import build_model
    from attnlab.models.hf import save_hf

    cfg = preset("gpt2", **sz.model)
    torch.manual_seed(0)
    save_hf(build_model(cfg).eval(), folder)
    return cfg.to_dict()


_first_tokens = itertools.count(1)


def prompts(seed: int, n: int, length: int, vocab: int) -> list[list[int]]:
    """n random prompts; each starts with a token no earlier prompt of this run started with, so no prompt can
    take a cached prefix (the pool reuses even a partial first block that starts the same)."""
    spec = LoadSpec(requests=n, concurrency=1, prompt_len=Lengths("fixed", length, length), seed=seed)
    out = [r.prompt for r in make_requests(spec, vocab)]
    for p in out:
        p[0] = next(_first_tokens) % vocab
    return out


def serve_args(args, sz: Sizes, chunk: int) -> list[str]:
    return ["--threads", str(args.threads), "--max-batch", str(sz.max_batch), "--kv-blocks", str(sz.kv_blocks),
            "--prefill-chunk", str(chunk)]


def through_server(url: str, ps: list[list[int]], out: int, concurrency: int, vocab: int) -> dict:
    res = run_load(url, LoadSpec(requests=len(ps), concurrency=concurrency, prompts=ps, vocab=vocab,
                                 output_len=Lengths("fixed", out, out)))
    res.pop("per_request")
    return {"tok_per_s": res["output_tok_per_s"], "wall_s": res["wall_s"], "output_tokens": res["output_tokens"],
            "failed": res["failed"], "cached_tokens": res["server_usage"]["cached_tokens"],
            "ttft_p50_s": res["ttft_s"]["p50"], "tpot_p50_s": res["tpot_s"]["p50"]}


def throughput_section(args, sz: Sizes, url: str, folder: str, vocab: int) -> dict:
    """b (batching: 16 requests at once vs one at a time) and c-d (the server, the engine and the peers on the same
    64 prompts), in rounds of rotating order."""
    skipped = {side: why for side in PEERS if (why := peer_missing(side))}
    procs = {side: SideProcess(side, folder, args.threads, args.prefill_chunk, sz.max_batch, sz.kv_blocks)
             for side in ("engine", *PEERS) if side not in skipped}
    many = f"server_c{sz.peers}"
    warm = prompts(999, 2, sz.prompt, vocab)  # warm every path (not timed)
    through_server(url, warm, 4, 2, vocab)
    errors = {}
    for side, proc in list(procs.items()):
        try:
            proc(warm, 4)
        except Exception as e:  # a peer that fails is recorded, the rest goes on
            if side == "engine":
                raise
            errors[side] = f"{type(e).__name__}: {e}"
            proc.close()
            del procs[side]
    sides = {"server_c16": (sz.n, lambda ps: through_server(url, ps, sz.out, sz.n, vocab)),
             "server_c1": (sz.n, lambda ps: through_server(url, ps, sz.out, 1, vocab)),
             many: (sz.peers, lambda ps: through_server(url, ps, sz.out, sz.peers, vocab)),
             **{side: (sz.peers, lambda ps, proc=proc: proc(ps, sz.out)) for side, proc in procs.items()}}
    runs = {name: [] for name in sides}
    agree = []  # per round: share of the peers' sequences equal to the engine's, token for token
    names = list(sides)
    for r in range(args.rounds):
        shared = prompts(1000 * (r + 1), sz.peers, sz.prompt, vocab)  # c-d: one fresh set per round
        outputs = {}
        for name in names[r % len(names):] + names[:r % len(names)]:
            n, run = sides[name]
            ps = shared if n == sz.peers else prompts(1000 * (r + 1) + 1 + names.index(name), n, sz.prompt, vocab)
            res = run(ps)
            if "outputs" in res:
                outputs[name] = res.pop("outputs")
            runs[name].append(res)
            print(f"  round {r + 1} {name:18s} {res['tok_per_s']:8.1f} tok/s", flush=True)
        agree.append({peer: sum(a == b for a, b in zip(outputs[peer], outputs["engine"])) / sz.peers
                      for peer in outputs if peer != "engine"})
    rate = {name: [x["tok_per_s"] for x in v] for name, v in runs.items()}

    def ratio(a: str, b: str | list) -> dict:  # per round; b: a side, or sides whose fastest counts that round
        theirs = [max(xs) for xs in zip(*(rate[x] for x in ([b] if isinstance(b, str) else b)))]
        return summarize([x / y for x, y in zip(rate[a], theirs)])

    hf = [side for side in ("hf_generate_batch", "hf_generate") if side in rate]
    out = {"runs": runs, "tok_per_s": {k: summarize(v) for k, v in rate.items()}, "peers_requests": sz.peers,
           "batching_c16_over_c1": ratio("server_c16", "server_c1"),
           "server_over_engine": ratio(many, "engine"),
           "peers": {side: {"status": "ran", f"{many}_over": ratio(many, side)} if side in rate else
                     {"status": skipped.get(side) or f"failed: {errors.get(side)}"} for side in PEERS},
           "greedy_sequences_equal_to_engine": {peer: summarize([a[peer] for a in agree]) for peer in agree[0]}}
    if hf:
        out["server_over_strongest_hf"] = ratio(many, hf)
    for proc in procs.values():
        proc.close()
    out["all_runs_complete"] = all(x["output_tokens"] == sides[name][0] * sz.out and not x.get("failed")
                                   for name, v in runs.items() for x in v)
    return out


async def stall_run(url: str, sz: Sizes, vocab: int, seed: int) -> dict:
    """sz.streams streams; when each has sz.trigger tokens a long prompt arrives; gaps while it is prefilled."""
    streams = [Request(p, sz.stream_out) for p in prompts(seed, sz.streams, sz.stream_prompt, vocab)]
    long = Request(prompts(seed + 1, 1, sz.long_prompt, vocab)[0], sz.long_out)
    counts: dict[int, int] = {}
    ready = asyncio.Event()

    def on_token(res) -> None:
        counts[res.index] = len(res.token_s)
        if len(counts) == len(streams) and min(counts.values()) >= sz.trigger:
            ready.set()

    async with new_client() as client:
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(stream_request(client, url, r, t0, i, on_token=on_token))
                 for i, r in enumerate(streams)]
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait([waiter, asyncio.gather(*tasks)], return_when=asyncio.FIRST_COMPLETED)
        late = await stream_request(client, url, long, t0, len(streams)) if ready.is_set() else None
        done = await asyncio.gather(*tasks)
    if late is None or not late.ok or not all(r.ok for r in done):
        return {"error": "a stream failed or the long prompt was not sent",
                "errors": [r.error for r in [*done, late] if r is not None and r.error]}
    first = late.token_s[0]
    during = [b - a for r in done for a, b in zip(r.token_s, r.token_s[1:]) if b > late.sent_s and a < first]
    before = [b - a for r in done for a, b in zip(r.token_s, r.token_s[1:]) if b <= late.sent_s]
    return {"max_gap_during_long_prefill_s": max(during, default=0.0),
            "median_gap_before_s": statistics.median(before) if before else None,
            "max_itl_s": max(g for r in done for g in r.itl_s),
            "p95_tpot_s": percentile([r.tpot_s for r in done], 95), "long_ttft_s": late.ttft_s,
            "long_sent_after_s": late.sent_s}


def chunked_section(args, sz: Sizes, folder: str, vocab: int) -> dict:
    settings = [0, *sz.chunks]
    runs = {c: [] for c in settings}
    exits = []
    for r in range(args.rounds_chunked):
        for c in (settings if r % 2 == 0 else settings[::-1]):
            with LaunchedServer(folder, serve_args(args, sz, c)) as server:
                warm = prompts(900 + r, sz.streams, sz.stream_prompt, vocab)
                warm += prompts(950 + r, 1, sz.long_prompt, vocab)  # warms the long prefill's path too
                run_load(server.url, LoadSpec(requests=len(warm), concurrency=len(warm), prompts=warm, vocab=vocab,
                                              output_len=Lengths("fixed", 4, 4)))
                alone = run_load(server.url, LoadSpec(
                    requests=1, concurrency=1, prompts=prompts(700 + r, 1, sz.stream_prompt, vocab),
                    output_len=Lengths("fixed", sz.stream_out, sz.stream_out)))
                res = asyncio.run(stall_run(server.url, sz, vocab, seed=100 * (r + 1) + c))
                res["single_client_tpot_s"] = alone["tpot_s"]["p50"]
            exits.append(server.returncode)
            runs[c].append(res)
            gap, tpot = res.get("max_gap_during_long_prefill_s", 0.0), res.get("p95_tpot_s", 0.0)
            print(f"  round {r + 1} prefill chunk {c or 'whole':>5}: max gap {gap * 1e3:7.1f} ms, p95 TPOT "
                  f"{tpot * 1e3:6.1f} ms, alone {res['single_client_tpot_s'] * 1e3:6.1f} ms", flush=True)
    out = {"runs": {str(c): v for c, v in runs.items()}, "server_exit_codes": exits, "median": {}}
    for c, v in runs.items():
        if any("error" in x for x in v):
            out["median"][str(c)] = {"error": [x.get("errors") for x in v if "error" in x]}
            continue
        m = out["median"][str(c)] = {k: statistics.median(x[k] for x in v) for k in v[0]
                                     if all(x[k] is not None for x in v)}
        if c and "error" not in out["median"]["0"]:  # per-round ratios: each chunked run against the same round's
            m["max_gap_over_unchunked"] = statistics.median(  # unchunked one
                x["max_gap_during_long_prefill_s"] / y["max_gap_during_long_prefill_s"] for x, y in zip(v, runs[0]))
            m["p95_tpot_over_single_client"] = statistics.median(
                x["p95_tpot_s"] / x["single_client_tpot_s"] for x in v)
    return out


def load_table(sz: Sizes, url: str, vocab: int) -> list[dict]:
    rows = []
    for n in sz.clients:
        requests = max(sz.min_requests, 2 * n)
        common = dict(requests=requests, vocab=vocab, output_len=Lengths("fixed", sz.out, sz.out))
        closed = run_load(url, LoadSpec(concurrency=n, prompts=prompts(10_000 + n, requests, sz.prompt, vocab),
                                        **common))
        if not closed["ok"]:
            rows.append({"clients": n, "arrivals": "closed", "requests": requests, "failed_by": closed["failed_by"],
                         "errors": closed["errors"], "poisson": "not run: no closed-loop latency to set its rate"})
            continue
        rate = n / closed["e2e_s"]["mean"]
        poisson = run_load(url, LoadSpec(rate=rate, seed=n, prompts=prompts(20_000 + n, requests, sz.prompt, vocab),
                                         **common))
        for mode, res in (("closed", closed), ("poisson", poisson)):
            res.pop("per_request")
            rows.append({"clients": n, "arrivals": mode, "rate_req_per_s": rate if mode == "poisson" else None,
                         "requests": requests, **{k: res[k] for k in (
                             "ok", "failed", "failed_by", "errors", "wall_s", "output_tok_per_s", "requests_per_s",
                             "mean_in_flight", "ttft_s", "tpot_s", "e2e_s", "itl_s", "max_itl_s")},
                         "cached_tokens": res["server_usage"]["cached_tokens"]})
            ms = {k: "/".join("-" if res[k][q] is None else f"{res[k][q] * 1e3:.1f}" for q in ("p50", "p95", "p99"))
                  for k in ("ttft_s", "tpot_s")}
            print(f"  {n:3d} clients {mode:8s} {res['output_tok_per_s']:8.1f} tok/s, TTFT p50/p95/p99 "
                  f"{ms['ttft_s']} ms, TPOT {ms['tpot_s']} ms, in flight {res['mean_in_flight']:.1f}, "
                  f"failed {res['failed']}", flush=True)
    return rows


def targets(tp: dict, ch: dict, sz: Sizes) -> dict:
    t = {"batching_c16_ge_4x_c1": tp["batching_c16_over_c1"]["median"] >= 4,
         f"server_c{sz.peers}_ge_90pct_of_engine": tp["server_over_engine"]["median"] >= 0.9,
         f"server_c{sz.peers}_ge_1.5x_strongest_hf": tp["server_over_strongest_hf"]["median"] >= 1.5
         if "server_over_strongest_hf" in tp else "not measured: " + tp["peers"]["hf_generate"]["status"]}
    for c in sz.chunks:
        m = ch["median"][str(c)]
        t[f"chunk{c}_max_gap_le_quarter_of_unchunked"] = m["max_gap_over_unchunked"] <= 0.25 \
            if "max_gap_over_unchunked" in m else "not measured"
        t[f"chunk{c}_p95_tpot_le_3x_single_client"] = m["p95_tpot_over_single_client"] <= 3 \
            if "p95_tpot_over_single_client" in m else "not measured"
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the server, the engine and HF")
    p.add_argument("--rounds", type=int, default=3, help="rounds of b-d, each in another order")
    p.add_argument("--rounds-chunked", type=int, default=2, help="rounds of e (alternating order)")
    p.add_argument("--prefill-chunk", type=int, default=256,
                   help="the b-d and f server's --prefill-chunk, and the in-process engine's (0: whole prompts)")
    p.add_argument("--quick", action="store_true", help="a tiny model and a few requests: a smoke test")
    p.add_argument("--out", help="default benchmarks/results/serve_load.json (--quick: in the temp folder)")
    args = p.parse_args()
    set_threads(args.threads)
    sz = QUICK if args.quick else FULL
    if args.quick:
        args.rounds, args.rounds_chunked = min(args.rounds, 2), 1
    out_path = args.out or (str(Path(tempfile.gettempdir()) / "serve_load_quick.json") if args.quick
                            else "benchmarks/results/serve_load.json")
    result = {"benchmark": "serve_load", "context": context(seed=0),
              "settings": {"args": vars(args), "sizes": asdict(sz), "dtype": "fp32",
                           "server_flags": serve_args(args, sz, args.prefill_chunk),
                           "engine": {"max_batch": sz.max_batch, "kv_blocks": sz.kv_blocks, "block_size": 16,
                                      "prefill_chunk": args.prefill_chunk or None,
                                      "process": "its own (stepped in a thread, as the server's engine)"},
                           "peers": {"hf_generate_batch": "benchmarks/hf_continuous.run_hf_generate_batch",
                                     "hf_generate": "benchmarks/hf_continuous.run_hf_generate",
                                     "ctranslate2": "benchmarks/vs_ctranslate2.ct2_side (fp32, generate_batch)",
                                     "process": "each its own"}}}
    peak0, bw0 = matmul_peak_flops(), memory_bandwidth()
    with tempfile.TemporaryDirectory() as folder:
        result["model"] = build_folder(sz, folder)
        vocab = result["model"]["vocab_size"]
        print("b-d and f: one server, prefill chunk", args.prefill_chunk, flush=True)
        with LaunchedServer(folder, serve_args(args, sz, args.prefill_chunk)) as server:
            tp = result["throughput"] = throughput_section(args, sz, server.url, folder, vocab)
            result["load_table"] = load_table(sz, server.url, vocab)
        result["server_exit_code"] = server.returncode
        print("e: chunked prefill", flush=True)
        ch = result["chunked_prefill"] = chunked_section(args, sz, folder, vocab)
    result["calibration"] = {"matmul_peak_flops": [peak0, matmul_peak_flops()],
                             "bandwidth_bytes_per_s": [bw0, memory_bandwidth()]}
    result["targets"] = targets(tp, ch, sz)
    print(f"c16 / c1 {tp['batching_c16_over_c1']['median']:.2f}x; server / engine at {sz.peers} "
          f"{tp['server_over_engine']['median']:.1%}; " + "; ".join(
              f"server / {side} " + (f"{v[f'server_c{sz.peers}_over']['median']:.2f}x" if v["status"] == "ran"
                                     else v["status"]) for side, v in tp["peers"].items()))
    print("targets:", result["targets"])
    print(f"wrote {write_json(out_path, result)}")


if __name__ == "__main__":
    main()

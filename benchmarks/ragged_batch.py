"""Ragged batches, paged memory and prefix sharing, measured on the GPT-2 small shape (random weights, fp32).

1. Ragged decode: n sequences whose contexts are spread from 64 to 1,024 tokens, decoded together by the
   engine's one step, against the same sequences decoded one after another (n = 1, 2, 4, 8, 16). Both
   sides run through the same Engine and are timed by the same clock (the stamps of their first and last
   tokens: decode only, the prefill is the same work either way), in alternating order after a warm-up of
   each; each side uses the weight layout packed for its own row count. Greedy outputs must be identical.
   Target: >= 4x output tokens/s at n = 8.
2. Paged memory: 16 sequences of mixed lengths held at once; KV bytes of the paged cache against the tokens
   actually cached (target: within one block per sequence), and the contiguous cache's bytes for the same work.
3. Prefix sharing: 8 requests sharing a 512-token prefix; the prefix's blocks held once, and the TTFT of
   requests 2..8 (prefix from the cache) against request 1 (cold).

    python benchmarks/ragged_batch.py [--threads 2] [--new-tokens 32] [--rounds 3] [--quick]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import context, set_threads, summarize, write_json  # noqa: E402

from attnlab.config import preset  # noqa: E402
from attnlab.engine.quantize import set_precision  # noqa: E402
from attnlab.engine.engine import Engine, EngineConfig  # noqa: E402
from attnlab.engine.request import Request  # noqa: E402
from attnlab.models import build_model  # noqa: E402


def contexts(n: int, lo: int = 64, hi: int = 1024, new: int = 32) -> list[int]:
    """n prompt lengths spread evenly from lo to hi - new (so every context stays within 1,024)."""
    top = hi - new
    return [(lo + top) // 2] if n == 1 else [lo + round(i * (top - lo) / (n - 1)) for i in range(n)]


def run(engine, prompts, new: int) -> list:
    """Add every prompt, step until done: each request's result, in order."""
    ids = [engine.add(Request(p, new)) for p in prompts]
    results = {}
    while engine.has_work:
        results.update((e.id, e.result) for e in engine.step() if e.done)
    return [results[i] for i in ids]


def decode_rate(model, prompts, new: int, together: bool, paged: bool = False) -> tuple[float, list[list[int]]]:
    """Output tokens/s of the decode phase, and the tokens. Together: one engine for all; else one each."""
    groups = [prompts] if together else [[p] for p in prompts]
    tokens, decode_s, n_tokens = [], 0.0, 0
    for group in groups:
        engine = Engine(model, EngineConfig(max_batch=len(group), max_len=max(len(p) for p in group) + new,
                                            paged=paged, prefix_reuse=paged))
        seqs = run(engine, group, new)
        first = max(s.added_s + s.stamps_s[0] for s in seqs)  # decode starts once every prefill is done
        last = max(s.added_s + s.stamps_s[-1] for s in seqs)
        decode_s += last - first
        n_tokens += sum(len(s.tokens) - 1 for s in seqs)
        tokens += [s.tokens for s in seqs]
    return n_tokens / decode_s, tokens


def ragged_decode(args, base) -> dict:
    out = {}
    sizes = [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16]
    for n in sizes:
        g = torch.Generator().manual_seed(100 + n)
        prompts = [torch.randint(0, 50257, (c,), generator=g).tolist() for c in contexts(n, new=args.new_tokens)]
        batched = set_precision(copy.deepcopy(base), "fp32", rows=n)  # each side at its own weight layout
        single = set_precision(copy.deepcopy(base), "fp32", rows=1)
        decode_rate(batched, prompts[:1], 4, True)  # warm up both paths
        decode_rate(single, prompts[:1], 4, False)
        together, alone, ratios, same = [], [], [], True
        for r in range(args.rounds):  # alternate which side goes first
            order = [True, False] if r % 2 == 0 else [False, True]
            got = {}
            for side in order:
                got[side] = decode_rate(batched if side else single, prompts, args.new_tokens, side)
            together.append(got[True][0])
            alone.append(got[False][0])
            ratios.append(got[True][0] / got[False][0])
            same = same and got[True][1] == got[False][1]
        out[n] = {"contexts": [len(p) for p in prompts], "together_tok_per_s": summarize(together),
                  "one_after_another_tok_per_s": summarize(alone), "ratio": summarize(ratios),
                  "greedy_outputs_identical": same}
        print(f"ragged decode n={n:2d}: together {statistics.median(together):6.1f} tok/s, one after another "
              f"{statistics.median(alone):6.1f} tok/s -> {statistics.median(ratios):.2f}x "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f}); identical: {same}", flush=True)
        if n == 8:  # the paged cache on the same work (its rows gather their keys from blocks)
            rate_p, toks_p = decode_rate(batched, prompts, args.new_tokens, True, paged=True)
            out[n]["paged_together_tok_per_s"] = rate_p
            out[n]["paged_identical"] = toks_p == got[True][1]
            print(f"  paged cache, n=8: {rate_p:6.1f} tok/s, identical: {toks_p == got[True][1]}", flush=True)
        del batched, single
    return out


def paged_memory(base, new: int = 8) -> dict:
    model = set_precision(copy.deepcopy(base), "fp32", rows=16)
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(16, 513, (16,), generator=g).tolist()
    prompts = [torch.randint(0, 50257, (n,), generator=g).tolist() for n in lengths]
    engine = Engine(model, EngineConfig(max_batch=16, paged=True, kv_blocks=16 * (512 + new) // 16 + 16,
                                        block_size=16))
    counts = {engine.add(Request(p, new)): 0 for p in prompts}
    while any(n < new - 1 for n in counts.values()):  # stop one step before they finish and free their blocks
        for e in engine.step():
            counts[e.id] += 1
    st = engine.stats()
    cached = int(engine.scheduler.state.pos.sum())
    bytes_per_block = st["kv_bytes_per_block"]
    per_token = bytes_per_block // st["kv_block_size"]
    held = engine.state_bytes
    contiguous = 16 * (max(lengths) + new) * per_token  # generate's contiguous cache: every row sized to the longest
    while engine.has_work:
        engine.step()
    res = {"sequences": 16, "prompt_lengths": lengths, "tokens_cached": cached, "bytes_of_tokens": cached * per_token,
           "paged_bytes_held": held, "slack_bytes": held - cached * per_token,
           "slack_blocks_per_sequence": (held - cached * per_token) / bytes_per_block / 16,
           "contiguous_bytes_same_work": contiguous, "blocks_free_after": engine.stats()["kv_blocks_free"],
           "within_one_block_per_sequence": held - cached * per_token <= 16 * bytes_per_block}
    print(f"paged memory: {cached} tokens cached = {cached * per_token / 2**20:.1f} MiB; paged holds "
          f"{held / 2**20:.1f} MiB ({res['slack_blocks_per_sequence']:.2f} blocks of slack per sequence); "
          f"contiguous for the same work {contiguous / 2**20:.1f} MiB", flush=True)
    return res


def prefix_sharing(base, new: int = 8) -> dict:
    model = set_precision(copy.deepcopy(base), "fp32", rows=1)
    g = torch.Generator().manual_seed(9)
    prefix = torch.randint(0, 50257, (512,), generator=g).tolist()
    suffixes = [torch.randint(0, 50257, (16,), generator=g).tolist() for _ in range(8)]
    engine = Engine(model, EngineConfig(max_batch=8, paged=True, kv_blocks=8 * 34 + 64, block_size=16))
    bytes_per_block = engine.stats()["kv_bytes_per_block"]

    def ttft(prompt):
        r = run(engine, [prompt], new)[0]
        return r.stamps_s[0], r.cached_tokens

    ttft(torch.randint(0, 50257, (528,), generator=g).tolist())  # warm-up on another prefix
    cold, _ = ttft(prefix + suffixes[0])
    warm = [ttft(prefix + s) for s in suffixes[1:]]
    # all 8 at once, with fresh suffixes: the prefix's blocks are held once
    for s in suffixes:
        engine.add(Request(prefix + [t + 1 for t in s], new))
    engine.step()
    tables = engine.scheduler.state.tables
    unique = len({b for t in tables for b in t})
    summed = sum(len(t) for t in tables)
    while engine.has_work:
        engine.step()
    res = {"prefix_tokens": 512, "ttft_first_s": cold, "ttft_next_s": [w for w, _ in warm],
           "cached_tokens_next": [c for _, c in warm],
           "ttft_ratio_next_over_first": statistics.median(w for w, _ in warm) / cold,
           "blocks_held_together": unique, "blocks_without_sharing": summed,
           "bytes_held_together": unique * bytes_per_block, "bytes_without_sharing": summed * bytes_per_block,
           "prefix_blocks_shared_by_all": len(set.intersection(*(set(t[:32]) for t in tables)))}
    print(f"prefix sharing: TTFT first {cold * 1e3:.0f} ms, next 7 median "
          f"{statistics.median(w for w, _ in warm) * 1e3:.0f} ms ({res['ttft_ratio_next_over_first']:.3f}x), "
          f"cached {warm[0][1]} tokens each; 8 together hold {unique} blocks "
          f"({unique * bytes_per_block / 2**20:.1f} MiB) vs {summed} without sharing", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="sizes 1-8 only")
    p.add_argument("--out", default="benchmarks/results/ragged_batch.json")
    args = p.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    base = build_model(preset("gpt2")).eval()
    result = {"context": context(seed=0), "settings": vars(args)}
    with torch.inference_mode():
        result["ragged_decode"] = ragged_decode(args, base)
        result["paged_memory"] = paged_memory(base)
        result["prefix_sharing"] = prefix_sharing(base)
    print(f"wrote {write_json(args.out, result)}")


if __name__ == "__main__":
    main()

"""attnlab's engine vs Hugging Face transformers on GPT-2 small's shape, and speculative decoding, in one run.

    python benchmarks/decode_vs_hf.py [--rounds 6] [--new-tokens 32] [--quick] [--as-avx2]

GPT-2 section. Same random weights on both sides (HF builds GPT-2 small and saves safetensors; attnlab loads
the folder), batch 1, greedy, the same dtype on both sides where HF has it (fp32, bf16; attnlab's int8 is
compared with HF fp32 and bf16), the machine's matmul peak and bandwidth calibrated in the same process just
before and after.

The clock, one for every side: this script reads time.perf_counter() just before the call and just after it
returns (common.timed_call), around HF's `model.generate(...)` and attnlab's `generate(...)` alike, request
checks and set-up included; neither library's own timestamps are used.
- TTFT = the wall time of a call that asks for one new token: from the call until the first token is returned.
- TPOT is timed twice: after the 512-token prompt, and after a prompt that fills the context (1,024 - n tokens),
  where each step reads about twice the KV cache (~35 MB more per step in fp32 for GPT-2 small).
- time per output token (TPOT) = (wall time of a call for n tokens - that of the 1-token call of the same round,
  same prompt) / (n - 1): both calls pay the same prefill, so the difference is the n - 1 decode steps.
  (`min_new_tokens` holds HF to exactly n; attnlab has no stop token here.) Chosen over streamer callbacks
  because it needs no hook inside either library: the same two clock reads around an ordinary call.
Order: the sides run forward in even rounds and reversed in odd ones (A B C, C B A, ...: ABBA for two sides);
--rounds is rounded up to even. Before any timing, every side (each library, each dtype) runs every timed call
shape once, untimed. Reported: each side's median, min and max over rounds, and each ratio as the median (and
min, max) of per-round ratios, the two sides of a ratio having been timed in the same round.

Trained section: benchmarks/speculative_trained.py (held-out loss of bf16 / int8, speculative decoding
tuned on separate prompts, measured on held-out ones), run from here unless --skip-trained.

bf16 and int8 (whose activations are bf16) run only where attnlab.runtime finds bf16 native: on a CPU that
emulates it they are ~100x slower than fp32 and are skipped, and the JSON says so (--dtypes forces them).
--quick: a 2-layer GPT-2 and, without the cached models, tiny untrained ones: a smoke run, not a measurement.
--as-avx2: the whole run, both libraries, in a process held to AVX2 (attnlab.runtime.AVX2_ONLY_ENV), the decode
targets' other machine class; it tests the code paths such a CPU takes, on this machine's cores and memory.
Writes benchmarks/results/decode_vs_hf.json (decode_vs_hf_avx2.json with --as-avx2).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile

import torch

from attnlab.cli_measure import warn_if_emulated
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision, weight_bytes
from attnlab.models.hf import load_hf
from attnlab.runtime import fast_dtypes
from common import (context, matmul_peak_flops, memory_bandwidth, rerun_limited_to_avx2, round_order, round_ratios,
                    set_threads, summarize, timed_call, write_json)
from speculative_trained import trained_section



def prefill_flops(n_params_nonembed: int, n_layers: int, dim: int, vocab: int, T: int) -> float:
    """2 * N * T (every weight once per token) + 2 * L * T^2 * dim (causal QK^T and AV) + the last LM head row."""
    return 2 * n_params_nonembed * T + 2 * n_layers * T * T * dim + 2 * dim * vocab


def decode_bytes_per_token(model) -> int:
    """Weight bytes one decode step reads: all of them, less the embedding table (one row per token), unless the
    table is also the LM head (tied), which is read whole every token. ``model``: plain or an InferenceModel."""
    plain = getattr(model, "model", model)
    table = plain.tok_emb.weight
    head = {t.data_ptr() for t in [*plain.head.parameters(), *plain.head.buffers()]}
    return weight_bytes(model) - (0 if table.data_ptr() in head else table.numel() * table.element_size())


def gpt2_section(args, peak: float, bandwidth: float) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    quick_cfg = dict(vocab_size=1024, n_layer=2, n_embd=64, n_head=4, n_positions=256, bos_token_id=1023,
                     eos_token_id=1023)
    hf_cfg = GPT2Config(**quick_cfg) if args.quick else GPT2Config()
    hf = GPT2LMHeadModel(hf_cfg).eval()
    folder = tempfile.mkdtemp()
    hf.save_pretrained(folder)
    base, cfg, _, _ = load_hf(folder)
    low = [dt for dt in ("bf16", "int8") if dt in args.dtypes]  # reduced precisions this run measures
    models = {dt: set_precision(copy.deepcopy(base), dt) for dt in ("fp32", *low)}
    hf_models = {"fp32": hf, **({"bf16": copy.deepcopy(hf).to(torch.bfloat16)} if "bf16" in low else {})}
    short, long_ = (128, 254) if args.quick else (512, 1022)  # long: the context less room for the new tokens
    ctx = torch.randint(0, cfg.vocab_size, (1, long_ + 2), generator=torch.Generator().manual_seed(1))
    n = args.new_tokens
    # decode is also timed where the context ends full (prompt + n = the model's context, the most generate
    # accepts), so the n - 1 timed steps attend over 1,024 - n .. 1,022 cached positions
    deep = cfg.max_seq_len - n

    def hf_call(m, ids, k):
        with torch.inference_mode():
            out = m.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0)
        return out[0, ids.shape[1]:].tolist()

    sides = {}  # interleaved so that the sides of each ratio run next to each other
    for dt in ("fp32", *low):
        if dt in hf_models:
            sides[f"hf_{dt}"] = lambda ids, k, m=hf_models[dt]: hf_call(m, ids, k)
        sides[f"attnlab_{dt}"] = lambda ids, k, m=models[dt]: generate(m, ids[0].tolist(), k).tokens
    calls = {"ttft_short": (ctx[:, :short], 1), "n_short": (ctx[:, :short], n), "ttft_long": (ctx[:, :long_], 1),
             "one_deep": (ctx[:, :deep], 1), "n_deep": (ctx[:, :deep], n)}
    for side in sides:  # warm-up: every side, every timed call shape, untimed
        for ids, k in calls.values():
            sides[side](ids, k)
    t = {f"{side}_{what}": [] for side in sides for what in ("ttft_short", "ttft_long", "tpot", "tpot_deep")}
    tokens = {}
    rounds = args.rounds + args.rounds % 2
    for r in range(rounds):
        for side in round_order(list(sides), r):
            t1, _ = timed_call(lambda: sides[side](*calls["ttft_short"]))
            tn, tokens[side] = timed_call(lambda: sides[side](*calls["n_short"]))
            tl, _ = timed_call(lambda: sides[side](*calls["ttft_long"]))
            d1, _ = timed_call(lambda: sides[side](*calls["one_deep"]))
            dn, _ = timed_call(lambda: sides[side](*calls["n_deep"]))
            t[f"{side}_ttft_short"].append(t1)
            t[f"{side}_tpot"].append((tn - t1) / (n - 1))
            t[f"{side}_ttft_long"].append(tl)
            t[f"{side}_tpot_deep"].append((dn - d1) / (n - 1))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{s} {1e3 * t[f'{s}_tpot'][-1]:.0f} ms/token" for s in sides),
              flush=True)
    med = {k: statistics.median(v) for k, v in t.items()}
    nonembed = sum(p.numel() for name, p in base.named_parameters() if "tok_emb" not in name and "pos_enc" not in name)
    res = {"rounds": rounds, "order": "forward in even rounds, reversed in odd", "sides": list(sides),
           "raw_s": {k: summarize(v) for k, v in t.items()},
           "greedy_tokens_identical_to_hf": {dt: tokens[f"attnlab_{dt}"] == tokens[f"hf_{dt}"] for dt in hf_models}}
    hf_tpot = t["hf_fp32_tpot"]
    for dt in ("fp32", *low):
        ours = t[f"attnlab_{dt}_tpot"]
        per_token_bytes = decode_bytes_per_token(models[dt])
        bound = per_token_bytes / bandwidth
        d = res[f"decode_{dt}"] = {
            "tpot_ms": med[f"attnlab_{dt}_tpot"] * 1e3, "tpot_ms_min": 1e3 * min(ours), "tpot_ms_max": 1e3 * max(ours),
            "tok_per_s": 1 / med[f"attnlab_{dt}_tpot"],
            "speedup_vs_hf_fp32": round_ratios(hf_tpot, ours)["median"], "speedup_vs_hf_fp32_rounds": round_ratios(hf_tpot, ours),
            "bandwidth_bound_ms": bound * 1e3, "pct_of_bandwidth_bound": 100 * bound / med[f"attnlab_{dt}_tpot"],
            "weight_bytes_read_per_token": per_token_bytes}
        same = "bf16" if dt != "fp32" and "bf16" in hf_models else "fp32"  # int8 runs bf16 activations
        if same != "fp32":
            d[f"speedup_vs_hf_{same}"] = round_ratios(t[f"hf_{same}_tpot"], ours)["median"]
            d[f"speedup_vs_hf_{same}_rounds"] = round_ratios(t[f"hf_{same}_tpot"], ours)
        deep_ours = t[f"attnlab_{dt}_tpot_deep"]
        d["at_full_context"] = {
            "prompt_tokens": deep, "cached_positions": [deep, deep + n - 2],
            "tpot_ms": 1e3 * statistics.median(deep_ours), "tpot_ms_min": 1e3 * min(deep_ours),
            "tpot_ms_max": 1e3 * max(deep_ours),
            "hf_fp32_tpot_ms": 1e3 * med["hf_fp32_tpot_deep"],
            "speedup_vs_hf_fp32": round_ratios(t["hf_fp32_tpot_deep"], deep_ours)["median"],
            "speedup_vs_hf_fp32_rounds": round_ratios(t["hf_fp32_tpot_deep"], deep_ours)}
    for dt in hf_models:
        v = t[f"hf_{dt}_tpot"]
        res[f"decode_hf_{dt}"] = {"tpot_ms": 1e3 * med[f"hf_{dt}_tpot"], "tpot_ms_min": 1e3 * min(v),
                                  "tpot_ms_max": 1e3 * max(v), "tok_per_s": 1 / med[f"hf_{dt}_tpot"],
                                  "at_full_context_tpot_ms": 1e3 * med[f"hf_{dt}_tpot_deep"]}
    for label, what, T in (("ttft_512", "ttft_short", short), ("ttft_1024", "ttft_long", long_)):
        fl = prefill_flops(nonembed, cfg.n_layers, cfg.dim, cfg.vocab_size, T)
        ours, theirs = t[f"attnlab_fp32_{what}"], t[f"hf_fp32_{what}"]
        entry = res[label] = {"prompt_tokens": T, "attnlab_s": statistics.median(ours), "hf_s": statistics.median(theirs),
                              "attnlab_s_range": [min(ours), max(ours)], "hf_s_range": [min(theirs), max(theirs)],
                              "ratio_attnlab_over_hf": round_ratios(ours, theirs)["median"],
                              "ratio_rounds": round_ratios(ours, theirs),
                              "attnlab_pct_of_matmul_peak": 100 * fl / statistics.median(ours) / peak,
                              "hf_pct_of_matmul_peak": 100 * fl / statistics.median(theirs) / peak, "by_dtype": {}}
        for dt in low:  # attnlab's reduced precisions against HF in the same dtype where it has one, else fp32
            ref = f"hf_{dt}" if dt in hf_models else "hf_bf16" if "bf16" in hf_models else "hf_fp32"
            mine = t[f"attnlab_{dt}_{what}"]
            entry["by_dtype"][dt] = {"attnlab_s": statistics.median(mine), "attnlab_s_range": [min(mine), max(mine)],
                                     "against": ref, "against_s": statistics.median(t[f"{ref}_{what}"]),
                                     "ratio": round_ratios(mine, t[f"{ref}_{what}"])}
    res["targets"] = {
        "decode_fp32_ge_1.5x_hf": res["decode_fp32"]["speedup_vs_hf_fp32"] >= 1.5,
        "decode_fp32_ge_1.5x_hf_at_full_context": res["decode_fp32"]["at_full_context"]["speedup_vs_hf_fp32"] >= 1.5,
        **{f"decode_{dt}_ge_2.5x_hf_fp32": res[f"decode_{dt}"]["speedup_vs_hf_fp32"] >= 2.5 for dt in low},
        **{f"decode_{dt}_ge_2.5x_hf_fp32_at_full_context":
           res[f"decode_{dt}"]["at_full_context"]["speedup_vs_hf_fp32"] >= 2.5 for dt in low},
        "ttft_512_le_0.9x_hf": res["ttft_512"]["ratio_attnlab_over_hf"] <= 0.9,
        "ttft_1024_le_0.9x_hf": res["ttft_1024"]["ratio_attnlab_over_hf"] <= 0.9,
    }
    res["cache_vs_no_cache"] = cache_section(models["fp32"], ctx, (32, long_ - 8) if args.quick else (128, 1016),
                                             max(2, rounds // 2))
    return res


def cache_section(model, ctx: torch.Tensor, lengths, rounds: int) -> dict:
    """fp32 decode with vs without the KV cache. Both sides are attnlab's generate, so its own TPOT (the same
    clock on both sides) is used; each path warmed up, the order alternating per round."""
    cache = {}
    for T in lengths:
        prompt = ctx[0, :T].tolist()
        paths = {"cached": lambda: generate(model, prompt, 5), "uncached": lambda: generate(model, prompt, 5, use_cache=False)}
        for f in paths.values():
            f()
        tpot = {name: [] for name in paths}
        for r in range(rounds):
            for name in round_order(list(paths), r):
                tpot[name].append(paths[name]().stats.tpot_s)
        cache[str(T)] = {"cached_tpot_ms": 1e3 * statistics.median(tpot["cached"]),
                         "uncached_tpot_ms": 1e3 * statistics.median(tpot["uncached"]),
                         "speedup": round_ratios(tpot["uncached"], tpot["cached"])["median"],
                         "speedup_rounds": round_ratios(tpot["uncached"], tpot["cached"])}
    return cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="GPT-2 rounds (rounded up to even)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--spec-tokens", type=int, default=96)
    ap.add_argument("--spec-rounds", type=int, default=3, help="rounds of the held-out speculative measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="benchmarks/cache/spec-target")
    ap.add_argument("--draft", default="benchmarks/cache/spec-draft")
    ap.add_argument("--skip-trained", action="store_true")
    ap.add_argument("--skip-gpt2", action="store_true", help="only the trained-model section (quality, speculative)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny models, 2 rounds, few tokens")
    ap.add_argument("--dtypes", help="comma-separated, from fp32,bf16,int8 (default: those native here, "
                                     "attnlab.runtime.fast_dtypes)")
    ap.add_argument("--as-avx2", action="store_true",
                    help="hold torch, oneDNN, MKL and attnlab's kernels to AVX2 (an AVX2-only machine emulated on this "
                         "CPU; writes decode_vs_hf_avx2.json unless --out is given)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.as_avx2:
        rerun_limited_to_avx2()
    args.out = args.out or f"benchmarks/results/decode_vs_hf{'_avx2' if args.as_avx2 else ''}.json"
    if args.quick:
        args.rounds, args.new_tokens, args.spec_tokens, args.spec_rounds = 2, 4, 16, 2
    set_threads(args.threads)
    if args.dtypes:
        args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        for dt in args.dtypes:
            warn_if_emulated("decode_vs_hf", dt)
    else:
        args.dtypes = list(fast_dtypes("cpu"))
    args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]  # fp32 is every comparison's reference
    out = {"benchmark": "decode_vs_hf", "context": context(), "quick": args.quick, "batch": 1,
           "new_tokens": args.new_tokens, "dtypes": args.dtypes,
           "clock": "time.perf_counter() read by the benchmark around each whole call, on every side"}
    skipped = [dt for dt in ("bf16", "int8") if dt not in args.dtypes]
    if skipped:
        out["skipped_dtypes"] = {dt: "bf16 is emulated on this CPU (no avx512_bf16 or AMX), ~100x slower than fp32"
                                 + ("; int8 decodes with bf16 activations" if dt == "int8" else "")
                                 for dt in skipped}
    if not args.skip_gpt2:
        peak0, bw0 = matmul_peak_flops(), memory_bandwidth()
        g = out["gpt2_small"] = gpt2_section(args, peak0, bw0)
        peak1, bw1 = matmul_peak_flops(), memory_bandwidth()
        out["calibration"] = {"matmul_peak_flops": [peak0, peak1], "bandwidth_bytes_per_s": [bw0, bw1]}
        for dt in args.dtypes:
            d, t5 = g[f"decode_{dt}"], g["ttft_512"]
            ttft = t5["ratio_attnlab_over_hf"] if dt == "fp32" else t5["by_dtype"][dt]["ratio"]["median"]
            print(f"attnlab {dt}: {d['tpot_ms']:.1f} ms/token, {d['speedup_vs_hf_fp32']:.2f}x HF fp32 "
                  + "".join(f"({d[k]:.2f}x HF bf16) " for k in ["speedup_vs_hf_bf16"] if k in d)
                  + f"| at full context {d['at_full_context']['tpot_ms']:.1f} ms/token, "
                  + f"{d['at_full_context']['speedup_vs_hf_fp32']:.2f}x HF fp32 | TTFT 512 {ttft:.2f}x HF")
        print("targets:", g["targets"])
    if not args.skip_trained:
        t = out["trained"] = trained_section(args)
        print(json.dumps(t.get("summary", t), indent=1))
        print("targets:", t.get("targets"))
    write_json(args.out, out)


if __name__ == "__main__":
    main()

"""Attention kernels and mixers vs sequence length: time, peak memory, growth exponents, crossovers.

    python benchmarks/attention_scaling.py [--seq-lens 1024,2048,4096,8192,16384,32768] [--repeats 3]

Batch 1, 12 heads, head dim 64, fp32, causal; each configuration (kernel, length) in a fresh subprocess (peak
RSS over its own baseline), one untimed warm-up call of that kernel at that length, then --repeats (>= 3)
timed calls: each row gives their median (time_s) and spread (time_min_s, time_max_s). Configurations
predicted to need more than the budget are skipped and reported.
Writes benchmarks/results/attention_scaling.json.
"""
from __future__ import annotations

import argparse

from attnlab.bench import bench_attention, growth_exponent
from attnlab.cli_measure import warn_if_emulated
from common import context, matmul_peak_flops, set_threads, write_json

KERNELS = ["naive", "sdpa", "flash", "sliding", "block_sparse", "linear", "ssm"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-gb", type=float, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--out", default="benchmarks/results/attention_scaling.json")
    args = ap.parse_args()
    if args.repeats < 3:
        ap.error(f"--repeats {args.repeats}: a median with a spread needs at least 3 timed repeats")
    set_threads(args.threads)
    warn_if_emulated("attention_scaling", args.dtype)
    lens = [int(x) for x in args.seq_lens.split(",")]
    kernels = args.kernels.split(",")
    peak = matmul_peak_flops()
    rows = bench_attention(kernels, lens, repeats=args.repeats, budget_bytes=args.budget_gb * 2**30, dtype=args.dtype,
                           threads=args.threads, progress=lambda r: print(r, flush=True))
    by = {(r["kernel"], r["seq_len"]): r for r in rows}
    ok = lambda k, T: by.get((k, T), {}).get("status") == "ok"
    summary = {"exponents": {k: growth_exponent(rows, k) for k in kernels},
               "largest_seq_len_within_budget": {k: max((T for T in lens if ok(k, T)), default=None) for k in kernels}}
    if ok("flash", 8192) and ok("naive", 8192):
        summary["flash_over_naive_peak_memory_8k"] = by[("flash", 8192)]["peak_bytes"] / by[("naive", 8192)]["peak_bytes"]
    summary["flash_over_sdpa_time"] = {T: by[("flash", T)]["time_s"] / by[("sdpa", T)]["time_s"]
                                       for T in lens if ok("flash", T) and ok("sdpa", T)}
    for mixer in ("linear", "ssm", "sliding", "block_sparse"):
        faster = [T for T in lens if ok(mixer, T) and ok("sdpa", T) and by[(mixer, T)]["time_s"] < by[("sdpa", T)]["time_s"]]
        summary[f"{mixer}_overtakes_sdpa_at"] = min(faster) if faster else None
    ratios = [v for T, v in summary["flash_over_sdpa_time"].items() if T >= 4096]
    summary["targets"] = {
        "flash_memory_le_0.1x_naive_at_8k": summary.get("flash_over_naive_peak_memory_8k", 1.0) <= 0.1,
        "flash_time_le_2x_sdpa_from_4k": bool(ratios) and max(ratios) <= 2.0,
    }
    out = {"benchmark": "attention_scaling", "context": context(dtype=args.dtype), "heads": 12, "head_dim": 64,
           "batch": 1, "causal": True, "warmup_calls": 1, "repeats": args.repeats, "matmul_peak_flops": peak,
           "rows": rows, "summary": summary}
    write_json(args.out, out)
    print(summary)


if __name__ == "__main__":
    main()

"""Training tokens/s of attnlab's models on this machine, interleaved A, B, A, B in one run.

    python benchmarks/train_throughput.py [--seq-len 256] [--batch-size 8] [--pairs 5]

Compares the default model, a ~10M-parameter transformer and a ~10M-parameter LSTM (visible loop and
torch's fused kernel) at the same batch and sequence length. Writes benchmarks/results/train_throughput.json.
"""
from __future__ import annotations

import argparse
import time

import torch

from attnlab.config import TrainConfig, preset
from attnlab.models import build_model, count_params
from attnlab.fit import lm_loss, make_optimizer
from common import context, matmul_peak_flops, set_threads, summarize, write_json

MODELS = {"default": preset("default"), "transformer-10m": preset("small-10m"),
          "lstm-10m": preset("lstm-10m"), "lstm-10m-fused": preset("lstm-10m", fused=True)}


def step_time(model, opt, x, y) -> float:
    t = time.perf_counter()
    loss = lm_loss(model(x)[0], y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = ap.parse_args()
    set_threads(args.threads)
    torch.manual_seed(0)
    peak_before = matmul_peak_flops()
    setups = {}
    for name, cfg in MODELS.items():
        model = build_model(cfg).train()
        opt = make_optimizer(model, TrainConfig())
        x = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len))
        step_time(model, opt, x, x)  # warm-up
        setups[name] = (model, opt, x)
    times = {name: [] for name in MODELS}
    for _ in range(args.pairs):  # interleaved: each round times every model once
        for name, (model, opt, x) in setups.items():
            times[name].append(step_time(model, opt, x, x))
    tokens = args.batch_size * args.seq_len
    results = {name: {"params": count_params(setups[name][0]), "step_s": summarize(ts),
                      "tok_per_s": tokens / summarize(ts)["median"]} for name, ts in times.items()}
    ref = times["lstm-10m-fused"]
    for name, ts in times.items():
        results[name]["time_ratio_vs_lstm_fused"] = summarize([a / b for a, b in zip(ts, ref)])
    out = {"benchmark": "train_throughput", "seq_len": args.seq_len, "batch_size": args.batch_size,
           "context": context(), "matmul_peak_flops": max(peak_before, matmul_peak_flops()), "results": results}
    write_json(args.out, out)
    for name, r in results.items():
        print(f"{name:16s} {r['params']:>11,} params  {r['tok_per_s']:>9,.0f} tok/s  "
              f"step {r['step_s']['median'] * 1e3:8.1f} ms (min {r['step_s']['min'] * 1e3:.1f}, "
              f"max {r['step_s']['max'] * 1e3:.1f})")


if __name__ == "__main__":
    main()

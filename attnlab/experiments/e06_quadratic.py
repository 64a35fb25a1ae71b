"""Claim 6: attention's cost is quadratic in n; remedies change the exponent."""
import torch

from attnlab.cost.analytic import compare
from attnlab.cost.arch import resolve
from attnlab.experiments.base import Outcome, Plot, Series, fit_exponent, median_time, verdict
from attnlab.models.attention import KERNELS

TITLE = "Quadratic cost"
CLAIM = "Attention's time and memory grow quadratically with sequence length: doubling n costs about 4x."
PREDICTION = ("Naive attention's time grows with exponent ~2 and its score matrix with n^2; the cost model puts "
              "the attention-score growth from 8k to 128k tokens at ~256x against the MLP's 16x.")
THRESHOLD = "Supported if the naive kernel's fitted time exponent over the longest lengths is >= 1.6 and the cost-model factor is within 5% of 256."


def run(scale: str, device: str) -> Outcome:
    lens = [256, 512, 1024, 2048] if scale == "quick" else [512, 1024, 2048, 4096, 8192]
    H, D = (4, 64) if scale == "quick" else (12, 64)
    times = {k: [] for k in ("naive", "sdpa", "flash")}
    rows = []
    for T in lens:
        q, k, v = (torch.randn(1, H, T, D).to(device) for _ in range(3))
        for name in times:
            t = median_time(lambda: KERNELS[name](q, k, v, causal=True, alibi_slopes=None,
                                                  scale=D ** -0.5), repeats=2, device=device)
            times[name].append(t)
            rows.append({"kernel": name, "n": T, "time_s": t, "naive_score_bytes": H * T * T * 4})
    tail = slice(len(lens) // 2 - 1 if len(lens) > 3 else 0, None)
    exps = {k: fit_exponent(lens[tail], v[tail]) for k, v in times.items()}
    growth = compare(resolve("llama-3-8b"), 8192, 131072)["parts"]
    factor = growth["attention"]["factor"]
    ok = (exps["naive"] or 0) >= 1.6 and abs(factor / 256 - 1) < 0.05
    return Outcome(verdict(ok), f"naive time ~ n^{exps['naive']:.2f}; 8k->128k: attention x{factor:.0f}, MLP "
                   f"x{growth['mlp']['factor']:.0f}", {"lengths": lens, "exponents": exps, "times_s": times,
                                                      "cost_model_8k_to_128k": growth},
                   [Plot("Attention time vs n", "n (tokens)", "seconds", [Series(k, lens, v) for k, v in times.items()],
                         log_x=True, log_y=True),
                    Plot("Naive score-matrix bytes vs n", "n", "bytes", [Series("H*n^2*4", lens,
                         [H * T * T * 4 for T in lens])], log_x=True, log_y=True)], rows,
                   ["Memory shown is the score matrix naive attention materialises; `attnlab bench attention` "
                    "measures peak memory per kernel in fresh processes."])

"""Claim 8: the remedies for quadratic cost trade exactness or recall for speed and memory."""
import torch

from attnlab.experiments.base import Outcome, Plot, Series, fit_exponent, median_time, verdict
from attnlab.experiments.e03_path_length import train_mqar
from attnlab.models.attention import KERNELS
from attnlab.models.linear import linear_parallel, phi
from attnlab.models.sparse import default_block, pairs_scored
from attnlab.models.ssm import selective_scan

TITLE = "The remedies' trade"
CLAIM = ("Sliding-window, block-sparse, linear attention and state-space models cut attention's quadratic cost, "
         "and pay for it in what they can recall.")
PREDICTION = ("At long n their time grows with exponents near 1 (block_sparse ~1.5) against ~2 for exact attention; on "
              "MQAR, models with a bounded window or fixed-size state recall less than exact attention at equal budget.")
THRESHOLD = ("Supported if every remedy's time exponent is below exact attention's and exact attention's MQAR accuracy "
             "is >= every remedy's; inconclusive if no model reaches 50% MQAR accuracy (too little training).")


def _times(lens, device, H=4, D=64):
    out = {k: [] for k in ("sdpa", "flash", "sliding", "block_sparse", "linear", "ssm")}
    timed = lambda fn: median_time(fn, 2, device=device)
    for T in lens:
        q, k, v = (torch.randn(1, H, T, D).to(device) for _ in range(3))
        kw = dict(causal=True, alibi_slopes=None, scale=D ** -0.5)
        with torch.inference_mode():
            out["sdpa"].append(timed(lambda: KERNELS["sdpa"](q, k, v, **kw)))
            out["flash"].append(timed(lambda: KERNELS["flash"](q, k, v, **kw)))
            out["sliding"].append(timed(lambda: KERNELS["sliding"](q, k, v, window=256, **kw)))
            out["block_sparse"].append(timed(lambda: KERNELS["block_sparse"](q, k, v, block_size=default_block(T), **kw)))
            fq, fk = phi(q), phi(k)
            out["linear"].append(timed(lambda: linear_parallel(fq, fk, v, torch.zeros(1, H, D, D, device=device),
                                                               torch.zeros(1, H, D, device=device), 64)))
            E, N = H * D, 16
            u = q.transpose(1, 2).reshape(1, T, E)
            dl = torch.nn.functional.softplus(k.transpose(1, 2).reshape(1, T, E))
            B_, C_ = torch.randn(1, T, N).to(device), torch.randn(1, T, N).to(device)
            A = -torch.arange(1, N + 1, device=device).float().repeat(E, 1)
            out["ssm"].append(timed(lambda: selective_scan(u, dl, A, B_, C_, torch.ones(E, device=device),
                                                           torch.zeros(1, E, N, device=device), chunk=256)))
    return out


def run(scale: str, device: str) -> Outcome:
    lens = [512, 1024, 2048] if scale == "quick" else [1024, 2048, 4096, 8192, 16384]
    times = _times(lens, device)
    exps = {k: fit_exponent(lens, v) for k, v in times.items()}
    models = {"exact (sdpa)": dict(kernel="sdpa"), "sliding (w=8)": dict(kernel="sliding", window=8),
              "block_sparse": dict(kernel="block_sparse", block_size=6), "linear": dict(family="linear", pos="none"),
              "ssm": dict(family="ssm", pos="none")}
    steps = 200 if scale == "quick" else 1500
    acc = {name: train_mqar(kw, steps, 32, 4, 32, 64, device)[0] for name, kw in models.items()}
    faster = all(exps[k] < exps["sdpa"] for k in ("sliding", "block_sparse", "linear", "ssm"))
    recall = all(acc["exact (sdpa)"] >= a for a in acc.values())
    ok = (faster and recall) if max(acc.values()) >= 0.5 or not faster else None
    rows = [{"method": k, "time_exponent": exps[k], **{f"time_s_{T}": t for T, t in zip(lens, v)}} for k, v in times.items()]
    rows += [{"method": k, "mqar_accuracy": a} for k, a in acc.items()]
    names = list(acc)
    return Outcome(verdict(ok), f"time exponents: sdpa {exps['sdpa']:.2f}, sliding {exps['sliding']:.2f}, block_sparse "
                   f"{exps['block_sparse']:.2f}, linear {exps['linear']:.2f}, ssm {exps['ssm']:.2f}; MQAR: exact "
                   f"{acc['exact (sdpa)']:.0%} vs linear {acc['linear']:.0%}",
                   {"lengths": lens, "times_s": times, "exponents": exps, "mqar_accuracy": acc,
                    "pairs_scored": {T: {"causal": T * (T + 1) // 2, "block_sparse": pairs_scored(T, default_block(T))}
                                     for T in lens}},
                   [Plot("Time vs n (4 heads x 64)", "n (tokens)", "seconds", [Series(k, lens, v) for k, v in times.items()],
                         log_x=True, log_y=True),
                    Plot("MQAR accuracy at equal budget", "method (index)", "accuracy",
                         [Series("accuracy", list(range(len(names))), [acc[n] for n in names])])], rows,
                   ["x axis of the accuracy plot: " + ", ".join(f"{i}={n}" for i, n in enumerate(names)),
                    "MQAR here: 32 tokens, 4 pairs; the sliding window (8) cannot see most keys by construction."])

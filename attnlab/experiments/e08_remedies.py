"""Claim 8: the remedies for quadratic cost trade exactness or recall for speed and memory."""
import torch

from attnlab.experiments import recall
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, compare, fit_exponent, mean, plausible_exponent,
                                      spread, timing, verdict)
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
             "at the largest pair count is above every remedy's by more than the seed spread. Not supported if a "
             "check fails; inconclusive if no model reaches 50% MQAR accuracy (too little training), a recall "
             "difference is within the seed spread, or a fitted exponent is physically implausible (below 0.5, or "
             "an O(n*sqrt(n)) or quadratic kernel below 1: a measuring fault, not a result).")

CHANGES = [
    {"date": "2026-11-29", "what": "An inconclusive gate was added after the first results were seen.",
     "old": "Supported if every remedy's time exponent is below exact attention's and exact attention's MQAR accuracy "
            "is >= every remedy's.",
     "new": "... ; inconclusive if no model reaches 50% MQAR accuracy (too little training).",
     "why": "No model learned MQAR (all near chance). Recorded here on 2026-11-30: the change was not written down "
            "when it was made (verdict then: inconclusive)."},
    {"date": "2026-11-30", "what": "Recall trained per Zoology's recipe (shared with claim 3); timing warmed up and "
                                   "repeated; implausible fits and differences within the seed spread are inconclusive.",
     "old": "... and exact attention's MQAR accuracy is >= every remedy's; inconclusive if no model reaches 50% MQAR "
            "accuracy (too little training).",
     "new": THRESHOLD,
     "why": "Exponents came from 2 repeats with no warm-up (block_sparse fitted 0.68, below linear, and passed); "
            "recall was 200 steps at one learning rate, so nobody learned it."},
    recall.SSM_INIT_CHANGE,  # shared with claim 3: the same trained SSM
    {"date": "2026-12-01", "what": "method: what the exact kernel's timing runs (prediction and threshold unchanged)",
     "old": "sdpa = torch's scaled_dot_product_attention",
     "new": "sdpa = attnlab's compiled causal prefill attention for a causal fp32 call on a CPU outside autograd "
            "(kernels/prefill_attention.cpp, 0.5-0.8x torch's flash kernel's time on GPT-2 small's heads here), "
            "torch's kernel otherwise (GPU, training, other dtypes)",
     "why": "Issue 11: the engine's prefill now runs it, and the report times the kernel the engine runs. Still an "
            "exact O(n^2) attention; verdict at quick scale after the change: supported (sdpa exponent 1.86)."},
]

REMEDIES = ("sliding", "block_sparse", "linear", "ssm")
# Quick scale trains a bounded window and a fixed state (sliding, linear); block_sparse and the SSM are trained
# at full scale (their time exponents are measured at both).
RECALL_MODELS = {"quick": ("transformer", "sliding", "linear"), "full": ("transformer",) + REMEDIES}
# The lowest exponent each kernel can physically show at long n (its asymptotic growth, less noise).
LOWEST = {"sdpa": 1.0, "flash": 1.0, "sliding": 0.5, "block_sparse": 1.0, "linear": 0.5, "ssm": 0.5}
EST_S = {"quick": 45, "full": 600}


def _times(lens, device, repeats, H=4, D=64):
    out = {k: [] for k in ("sdpa", "flash", "sliding", "block_sparse", "linear", "ssm")}
    spreads = {k: [] for k in out}

    def timed(name, fn):
        t = timing(fn, repeats, warmup=1, device=device)
        out[name].append(t["median_s"])
        spreads[name].append([t["min_s"], t["max_s"]])

    for T in lens:
        q, k, v = (torch.randn(1, H, T, D).to(device) for _ in range(3))
        kw = dict(causal=True, alibi_slopes=None, scale=D ** -0.5)
        with torch.inference_mode():
            timed("sdpa", lambda: KERNELS["sdpa"](q, k, v, **kw))
            timed("flash", lambda: KERNELS["flash"](q, k, v, **kw))
            timed("sliding", lambda: KERNELS["sliding"](q, k, v, window=256, **kw))
            timed("block_sparse", lambda: KERNELS["block_sparse"](q, k, v, block_size=default_block(T), **kw))
            fq, fk = phi(q), phi(k)
            timed("linear", lambda: linear_parallel(fq, fk, v, torch.zeros(1, H, D, D, device=device),
                                                    torch.zeros(1, H, D, device=device), 64))
            E, N = H * D, 16
            u = q.transpose(1, 2).reshape(1, T, E)  # (1, T, H*D)
            dl = torch.nn.functional.softplus(k.transpose(1, 2).reshape(1, T, E))
            B_, C_ = torch.randn(1, T, N).to(device), torch.randn(1, T, N).to(device)
            A = -torch.arange(1, N + 1, device=device).float().repeat(E, 1)
            timed("ssm", lambda: selective_scan(u, dl, A, B_, C_, torch.ones(E, device=device),
                                                torch.zeros(1, E, N, device=device), chunk=256))
    return out, spreads


def measure(scale: str, device: str) -> dict:
    lens = [512, 1024, 2048] if scale == "quick" else [1024, 2048, 4096, 8192, 16384]
    times, spreads = _times(lens, device, 3 if scale == "quick" else 5)
    recall.prefetch(RECALL_MODELS[scale], scale, device)  # all runs of the sweep share the cores
    return {"lengths": lens, "times_s": times, "time_range_s": spreads,
            "pairs_scored": {T: {"causal": T * (T + 1) // 2, "block_sparse": pairs_scored(T, default_block(T))}
                             for T in lens},
            "recall_setup": recall.setup_dict(scale),
            "recall": {name: recall.summary(name, scale, device) for name in RECALL_MODELS[scale]}}


def decide(m: dict) -> Decision:
    lens = m["lengths"]
    exps = {k: fit_exponent(lens, v) for k, v in m["times_s"].items()}
    reasons = ["time exponents: " + ", ".join(f"{k} {e:.2f}" if e is not None else f"{k} ?" for k, e in exps.items())]
    implausible = [k for k, e in exps.items() if not plausible_exponent(e, LOWEST[k], 3.0)]
    faster = all(exps[k] is not None and exps["sdpa"] is not None and exps[k] < exps["sdpa"] for k in REMEDIES)
    reasons.append(f"every remedy's exponent below exact attention's: {'yes' if faster else 'no'}")
    if implausible:
        reasons.append("physically implausible fits (a measuring fault): " + ", ".join(implausible))
    rec = {f: {**r, "test": recall.by_int(r["test"])} for f, r in m["recall"].items()}
    top = max(rec["transformer"]["test"])
    at = {f: [s["acc"] for s in r["test"][top]] for f, r in rec.items()}
    smallest = min(rec["transformer"]["test"])
    learned = max(max(s["acc"] for s in r["test"][smallest]) for r in rec.values())
    wins = {f: compare(at["transformer"], at[f]) for f in REMEDIES if f in at}
    reasons.append(f"MQAR at {top} pairs: exact {mean(at['transformer']):.0%} (spread {spread(at['transformer']):.0%}) vs "
                   + ", ".join(f"{f} {mean(at[f]):.0%}" for f in wins)
                   + "; beaten beyond the spread: " + (", ".join(f for f, w in wins.items() if w) or "none"))
    if learned < 0.5:
        ok = None
        reasons.append(f"best accuracy at {smallest} pairs {learned:.0%} < 50%: recall not learned, inconclusive")
    elif implausible:
        ok = None
    elif not faster or any(w is False for w in wins.values()):
        ok = False
    elif any(w is None for w in wins.values()):
        ok = None
        reasons.append("a recall difference is within the seed spread: inconclusive")
    else:
        ok = True
    fmt = lambda e: "?" if e is None else f"{e:.2f}"
    figure = (f"time exponents: sdpa {fmt(exps['sdpa'])}, sliding {fmt(exps['sliding'])}, block_sparse "
              f"{fmt(exps['block_sparse'])}, linear {fmt(exps['linear'])}, ssm {fmt(exps['ssm'])}; MQAR at {top} pairs: "
              + ", ".join(f"{f} {mean(a):.0%}" for f, a in at.items()))
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    d = decide(m)
    lens, times, rec = m["lengths"], m["times_s"], m["recall"]
    pairs = sorted(int(p) for p in rec["transformer"]["test"])
    curve = {f: [mean([s["acc"] for s in r["test"][p]]) for p in pairs] for f, r in rec.items()}
    rows = [{"method": k, "time_exponent": fit_exponent(lens, v), **{f"time_s_{T}": t for T, t in zip(lens, v)}}
            for k, v in times.items()]
    rows += [{"method": f, "params": r["params"], **{f"mqar_{p}_pairs": curve[f][i] for i, p in enumerate(pairs)}}
             for f, r in rec.items()]
    return Outcome.of(d, m, [
        Plot("Time vs n (4 heads x 64)", "n (tokens)", "seconds", [Series(k, lens, v) for k, v in times.items()],
             log_x=True, log_y=True),
        Plot("MQAR accuracy vs key-value pairs", "key-value pairs", "test accuracy",
             [Series(f, pairs, c) for f, c in curve.items()])], rows,
        ["Recall models are claim 3's (same data, recipe and seeds): sliding has a window of 8 tokens, block_sparse "
         "blocks of 8; times are medians after a warm-up call."])

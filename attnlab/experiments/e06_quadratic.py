"""Claim 6: attention's cost is quadratic in n; remedies change the exponent.

The naive kernel runs in a fresh process (timing.run_fresh: every tensor over 64 KiB its own mapping): at each
length an untimed warm-up call, then timed repeats, and the process's peak resident memory during them above what
it held before (the peak reset per length); on CUDA, in this process, torch's peak allocation above the inputs.
Time and memory are both measured; the cost model's long-context factor is shown as the model. Each round is a
fresh process that times one call at every length and reads its own peaks: each round's time and memory exponents
are decided alone and the rounds must agree. The regime asks for lengths where the n^2 term dominates, measured: the score matrix's
memory well above the inputs', and calls long enough to be above the clock and dispatch floor.
"""
import gc

import torch

from attnlab.cost.analytic import compare as cost_compare
from attnlab.resolve import architecture
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, fit_exponent, in_regime, over_repeats,
                                      plausible_exponent, verdict)
from attnlab.timing import PeakMemory, run_fresh, time_calls
from attnlab.models.attention import KERNELS

TITLE = "Quadratic cost"
CLAIM = "Attention's time and memory grow quadratically with sequence length: doubling n costs about 4x."
PREDICTION = ("Naive attention's time grows with exponent ~2 and its measured peak memory with n^2 (it materialises "
              "the score matrix); the cost model puts the attention-score growth from 8k to 128k tokens at ~256x "
              "against the MLP's 16x.")
THRESHOLD = ("Decided per round (one timed call at every length; 3 rounds), the rounds required to agree: supported if "
             "the naive kernel's fitted time exponent over the longest lengths is >= 1.6 and its measured peak-memory "
             "exponent is >= 1.6; inconclusive if an exponent is physically implausible (below 1 or above 3: a "
             "measuring fault) or the rounds disagree. The cost model's 8k->128k factor is the model, shown but not "
             "in the verdict.")
REGIME = ("Lengths where the quadratic term dominates: at the shortest fitted length the naive kernel's measured peak "
          "memory is >= 4x its q, k, v inputs (the n^2 scores, not the O(n) tensors, fill it) and its time >= 10x "
          "that of an O(n) pass over q, k, v in the same process; every fitted call takes >= 1 ms (above the clock and the "
          "per-call dispatch).")
CHANGES = [
    {"date": "2026-11-30", "what": "prediction: memory is measured, not plotted from the formula",
     "old": ("Naive attention's time grows with exponent ~2 and its score matrix with n^2; the cost model puts the "
             "attention-score growth from 8k to 128k tokens at ~256x against the MLP's 16x."),
     "new": "Naive attention's time grows with exponent ~2 and its measured peak memory with n^2 (it materialises the score matrix); the cost model puts the attention-score growth from 8k to 128k tokens at ~256x against the MLP's 16x.",
     "why": "The score-matrix bytes were H*n^2*4 computed, not measured: they could not fail."},
    {"date": "2026-11-30", "what": "threshold: measured memory in, cost-model factor out, implausible fits inconclusive",
     "old": ("Supported if the naive kernel's fitted time exponent over the longest lengths is >= 1.6 and the "
             "cost-model factor is within 5% of 256."),
     "new": "Supported if the naive kernel's fitted time exponent over the longest lengths is >= 1.6 (from the median and from the fastest of the repeats alike) and its measured peak-memory exponent is >= 1.6; inconclusive if the two time fits fall on different sides of 1.6 or an exponent is physically implausible (below 1 or above 3: a measuring fault). The cost model's 8k->128k factor is the model, shown but not in the verdict.",
     "why": ("The 8k->128k factor is arithmetic on the FLOP formula (256 by construction); the memory half is now "
             "the naive kernel's peak measured in a fresh process per length; the time comes with a warm-up and a "
             "spread over repeats, and a fit no O(n^2) kernel can have is a measuring fault, not a verdict.")},
    {"date": "2026-12-02", "what": "threshold: per-round verdicts instead of median-vs-fastest fits; a measured regime",
     "old": ("Supported if the naive kernel's fitted time exponent over the longest lengths is >= 1.6 (from the median "
             "and from the fastest of the repeats alike) and its measured peak-memory exponent is >= 1.6; inconclusive "
             "if the two time fits fall on different sides of 1.6 or an exponent is physically implausible."),
     "new": THRESHOLD + " Regime: " + REGIME,
     "why": ("Issue 29: every verdict from >= 3 independent repetitions, each shown; the same 3 timed calls now make 3 "
             "rounds (no extra cost), and the lengths' being in the quadratic regime is measured. Verdict before: "
             "supported (full: exponents 2.13 median, 2.12 fastest, memory 1.98); after: supported at quick scale.")},
]
CHANGES.append(
    {"date": "2026-12-07", "what": "method: every round its own fresh process, with its own peak memory",
     "old": ("One fresh process timed 3 calls at every length (call r at every length made round r) and read one peak "
             "per length over all 3 calls; that peak's exponent was copied into every round."),
     "new": ("Each of the 3 rounds is a fresh process that times a warm-up and one call at every length and reads its "
             "own peak per length; each round's time and peak-memory exponents come from its own data."),
     "why": ("Issue 29's independent read: the memory half was one measurement shown three times, so its three "
             "rounds could not disagree. Prediction, threshold and regime unchanged. Verdict before: supported "
             "(reference b1c16d5, 3 of 3 rounds; time exponents per round from their own calls, memory 1.98 in all "
             "three); after: the reference at this change (reports/HISTORY.md).")})
EST_S = {"quick": 10, "full": 210}  # seconds on a 2-core CPU: the report's progress estimate
MIN_EXPONENT, PLAUSIBLE = 1.6, (1.0, 3.0)
REPEATS = 3  # rounds: each a fresh process timing one call per length
SCORES_OVER_INPUTS, TIME_OVER_LINEAR, MIN_CALL_S = 4.0, 10.0, 1e-3  # the REGIME above, as numbers


def naive_runs(lens, H, D, device, repeats: int = REPEATS) -> list[dict]:
    """Time (each of ``repeats`` calls after a warm-up, and their median, min, max) and peak bytes of the naive kernel
    at each length."""
    x = torch.randn(1, H, 64, D).to(device)
    with torch.inference_mode():  # one-time setup (thread pool, library init) before any baseline
        KERNELS["naive"](x, x, x, causal=True, alibi_slopes=None, scale=D ** -0.5)
    out = []
    for T in lens:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(1, H, T, D, generator=g).to(device) for _ in range(3))
        gc.collect()
        window = PeakMemory(device).start()  # the peak from here on is this length's
        with torch.inference_mode():
            call = lambda: KERNELS["naive"](q, k, v, causal=True, alibi_slopes=None, scale=D ** -0.5)  # noqa: E731
            calls = [time_calls(call, 1, warmup=1 if r == 0 else 0, device=device)["median_s"] for r in range(repeats)]
        peak = window.peak_bytes()
        with torch.inference_mode():  # after the peak is read: an O(n) pass, to see the n^2 term dominate the time
            linear = time_calls(lambda: torch.add(q, k).add_(v), 3, device=device)["median_s"]
        srt = sorted(calls)
        out.append({"n": T, "calls_s": calls, "median_s": srt[len(srt) // 2], "min_s": srt[0], "max_s": srt[-1],
                    "repeats": repeats, "linear_pass_s": linear, "peak_bytes": peak,
                    "input_bytes": 3 * q.numel() * q.element_size()})  # the inputs are rebound (freed) before the next base
    return out


def _round_runs(lens, H, D, device) -> list[dict]:
    """One round: a fresh process (on CUDA this one) runs the naive kernel once at every length, after a warm-up,
    with its own peak per length. A round per process, so no round reuses another's memory or its peak."""
    if torch.device(device).type == "cuda":
        return naive_runs(lens, H, D, device, 1)
    return run_fresh("attnlab.experiments.e06_quadratic", "naive_runs", [lens, H, D, str(device), 1])


def measure(scale: str, device: str) -> dict:
    lens = [256, 512, 1024, 2048] if scale == "quick" else [512, 1024, 2048, 4096, 8192]
    H, D = (4, 64) if scale == "quick" else (12, 64)
    failed, runs = [], []
    for _ in range(REPEATS):
        try:
            runs.append(_round_runs(lens, H, D, device))
        except (RuntimeError, OSError) as e:
            failed.append(f"naive run failed: {e}")
    per_len = [[run[i] for run in runs] for i in range(len(lens))]  # per length, one row per round
    pick = lambda rows, key: sorted(r[key] for r in rows)[len(rows) // 2] if rows else None  # noqa: E731 the median
    naive = [{"calls_s": [r["median_s"] for r in rows], "median_s": pick(rows, "median_s"),
              "min_s": min((r["min_s"] for r in rows), default=None), "max_s": max((r["max_s"] for r in rows), default=None),
              "peak_bytes": pick(rows, "peak_bytes"), "input_bytes": rows[0]["input_bytes"] if rows else None}
             for rows in per_len]
    times = {"naive": [r["median_s"] for r in naive]}
    spread = {"naive": [[r["min_s"], r["max_s"]] for r in naive]}
    for name in ("sdpa", "flash"):  # context: the exact kernels that never hold the score matrix
        times[name], spread[name] = [], []
        for T in lens:
            q, k, v = (torch.randn(1, H, T, D).to(device) for _ in range(3))
            with torch.inference_mode():
                t = time_calls(lambda: KERNELS[name](q, k, v, causal=True, alibi_slopes=None, scale=D ** -0.5),
                           repeats=REPEATS, device=device)
            times[name].append(t["median_s"])
            spread[name].append([t["min_s"], t["max_s"]])
    tail = slice(len(lens) // 2 - 1 if len(lens) > 3 else 0, None)
    fitted = lens[tail]
    fit = lambda ys: fit_exponent(fitted, ys) if runs else None  # noqa: E731 (no naive round ran: nothing to fit)
    exps = {k: fit_exponent(fitted, v[tail]) for k, v in times.items() if k != "naive"}
    exps["naive"] = fit(times["naive"][tail])
    exps["naive_fastest"] = fit([s[0] for s in spread["naive"]][tail])
    peak = [r["peak_bytes"] for r in naive]
    exps["naive_peak_bytes"] = fit(peak[tail])
    growth = cost_compare(architecture("llama-3-8b"), 8192, 131072)["parts"]
    rounds = [{"round": r + 1, "fitted_lengths": fitted, "calls_s": [row["median_s"] for row in run][tail],
               "time_exponent": fit_exponent(fitted, [row["median_s"] for row in run][tail]),
               "peak_bytes_by_length": [row["peak_bytes"] for row in run][tail],
               "peak_exponent": fit_exponent(fitted, [row["peak_bytes"] for row in run][tail]),
               "peak_bytes": run[tail][0]["peak_bytes"], "input_bytes": run[tail][0]["input_bytes"],
               "median_s": run[tail][0]["median_s"], "linear_pass_s": run[tail][0].get("linear_pass_s")}
              for r, run in enumerate(runs)]
    return {"lengths": lens, "heads": H, "head_dim": D, "times_s": times, "time_range_s": spread,
            "naive_peak_bytes": peak, "exponents": exps, "failed": failed, "rounds": rounds,
            "model_8k_to_128k": {k: growth[k]["factor"] for k in ("attention", "mlp")}}


def regime(rnd: dict) -> list[dict]:
    peak, inputs, calls = rnd.get("peak_bytes"), rnd.get("input_bytes"), [c for c in rnd["calls_s"] if c is not None]
    ratio = peak / inputs if peak and inputs else float("nan")
    fastest = min(calls) if calls else float("nan")
    lin, med = rnd.get("linear_pass_s"), rnd.get("median_s")
    over = med / lin if med and lin else float("nan")
    n0 = rnd["fitted_lengths"][0]
    return [condition(f"peak memory / q,k,v bytes at n={n0}", ratio, f">= {SCORES_OVER_INPUTS:.0f}x",
                      ratio >= SCORES_OVER_INPUTS, f"{ratio:.1f}x"),
            condition(f"naive call / an O(n) pass over q,k,v at n={n0}", over, f">= {TIME_OVER_LINEAR:.0f}x",
                      over >= TIME_OVER_LINEAR, f"{over:.1f}x"),
            condition("shortest fitted call", fastest, f">= {MIN_CALL_S * 1e3:.0f} ms", fastest >= MIN_CALL_S,
                      f"{fastest * 1e3:.2f} ms")]


def decide_one(rnd: dict, failed=()) -> Decision:
    t, mem = rnd["time_exponent"], rnd["peak_exponent"]
    fmt = lambda x: "none" if x is None else f"{x:.2f}"
    reasons = ["naive runs failed: " + "; ".join(failed)] if failed else []
    figure = f"round {rnd['round']}: naive time ~ n^{fmt(t)}, peak memory ~ n^{fmt(mem)}"
    plausible = all(plausible_exponent(x, *PLAUSIBLE) for x in (t, mem))
    if failed or not plausible:
        reasons.append(f"round {rnd['round']}: time exponent {fmt(t)}, memory exponent {fmt(mem)}: "
                       f"{'a run failed' if failed else 'outside ' + str(PLAUSIBLE) + ': a measuring fault'}")
        return Decision(verdict(None), figure, reasons)
    ok = t >= MIN_EXPONENT and mem >= MIN_EXPONENT
    reasons.append(f"round {rnd['round']}: naive time exponent {t:.2f}, peak-memory exponent {mem:.2f} "
                   f"(each >= {MIN_EXPONENT}?): {'yes' if ok else 'no'}")
    return Decision(verdict(ok), figure, reasons)


def decide(measured: dict) -> Decision:
    failed = measured.get("failed") or []
    if not measured["rounds"]:
        return Decision(verdict(None), "no naive round ran", ["naive runs failed: " + "; ".join(failed)])
    d = over_repeats([in_regime(regime(r), decide_one(r, failed)) for r in measured["rounds"]])
    e, model = measured["exponents"], measured.get("model_8k_to_128k", {})
    fmt = lambda x: "none" if x is None else f"{x:.2f}"
    d.figure = (f"naive time ~ n^{fmt(e.get('naive'))} (median of the calls), peak memory ~ n^{fmt(e.get('naive_peak_bytes'))}"
                + (f"; model 8k->128k: attention x{model['attention']:.0f}, MLP x{model['mlp']:.0f}" if model else ""))
    if model:
        d.reasons.append("model (not in the verdict): 8k->128k attention x{:.0f}, MLP x{:.0f}".format(
            model["attention"], model["mlp"]))
    return d


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    lens, times, H = m["lengths"], m["times_s"], m["heads"]
    rows = [{"kernel": k, "n": T, "time_s": v[i], "time_min_s": m["time_range_s"][k][i][0],
             "time_max_s": m["time_range_s"][k][i][1],
             **({"peak_bytes": m["naive_peak_bytes"][i], "score_matrix_bytes (formula)": H * T * T * 4}
                if k == "naive" else {})} for k, v in times.items() for i, T in enumerate(lens)]
    return Outcome.of(decide(m), m,
                      [Plot("Attention time vs n", "n (tokens)", "seconds", [Series(k, lens, v) for k, v in times.items()],
                            log_x=True, log_y=True),
                       Plot("Naive attention peak memory vs n", "n (tokens)", "bytes",
                            [Series("measured peak", lens, m["naive_peak_bytes"]),
                             Series("score matrix H*n^2*4 (formula)", lens, [H * T * T * 4 for T in lens])],
                            log_x=True, log_y=True)], rows,
                      ["naive: timed in a fresh process whose peak resident memory is reset per length and read above "
                       "what it held before the calls (on CUDA, torch's peak allocation); sdpa and flash timed in this "
                       "process.",
                       f"Times are the median of {REPEATS} calls after a warm-up (each call at every length one "
                       "round); the table gives the fastest and slowest. The 8k->128k factors are the cost model's "
                       "arithmetic, not measurements."])

"""Claim 2: parallel hardware idles on a sequential chain.

Training steps of a transformer and of an LSTM of equal size (parameters within +-10%, the LSTM's width searched),
the LSTM run as its visible loop of dependent steps and as torch's fused kernel, timed in rounds that alternate the
models; utilisation = analytic FLOPs over step time over the matmul peak measured in the same run (the faster of
MKL's and oneDNN's products, read before the first round and after every round: the best reading). Each round is
decided alone and the rounds must agree. Every clause of the prediction is decided; the clause the data refuted
("the fused kernel does not close the gap") is still computed and shown as the verdict under the old wording.
"""

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.cost.analytic import forward_flops
from attnlab.cost.arch import from_model_config
from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, Series, condition, in_regime, over_repeats,
                                      verdict)
from attnlab.timing import matmul_peak, time_calls
from attnlab.models import build_model, count_params
from attnlab.fit import lm_loss, make_optimizer

TITLE = "Parallel hardware idles on a chain"
CLAIM = ("A transformer keeps the machine's arithmetic units busier than an LSTM of equal size, because its work "
         "comes in large independent matmuls instead of a chain of small dependent steps.")
OLD_PREDICTION = ("Training FLOP/s as a share of this machine's measured matmul peak is higher for the transformer than "
                  "for the LSTM (visible loop) at every length; the fused LSTM kernel narrows but does not close the gap.")
PREDICTION = ("On parallel hardware (where one link of the chain cannot fill the machine), training FLOP/s as a share "
              "of the machine's measured matmul peak is higher for the transformer than for an LSTM of equal size at "
              "every length, whether the LSTM runs as its visible loop of dependent steps or as the fused kernel.")
_THRESHOLD_RANGE = ("Supported if, in every round, at every measured length, the transformer's utilisation is above "
                    "both the looped and the fused LSTM's, each beyond the spread of the repeated steps (the lower one's "
                    "highest below the higher one's lowest); not supported if it is below either beyond that spread at "
                    "some length; inconclusive if ranges overlap or the rounds disagree.")
_THRESHOLD_NO_MARGIN = ("Supported if, in every round, at every measured length, the transformer's utilisation is "
                        "above both the looped and the fused LSTM's, each beyond the spread of the repeated steps (the "
                        "middle half of 5 steps: the lower one's upper quartile below the higher one's lower quartile); "
                        "not supported if it is below either beyond that spread at some length; inconclusive if the "
                        "middle halves overlap or the rounds disagree.")
MATERIAL = 0.10  # the THRESHOLD's margin: "busier" means by more than this share of the other's utilisation
THRESHOLD = ("Supported if, in every round, at every measured length, the transformer's utilisation exceeds both the "
             "looped and the fused LSTM's by more than 10% of theirs, beyond the spread of the repeated steps (the "
             "middle half of 5 steps: the transformer's lower quartile above 1.1x the LSTM's upper quartile); not "
             "supported if at some length it does not reach 1.1x either beyond that spread (its upper quartile below "
             "1.1x the LSTM's lower quartile); inconclusive if neither holds or the rounds disagree.")
PARALLEL = 0.5  # the REGIME: one recurrent step's matmul reaches at most this share of the peak
REGIME = ("Parallel hardware for this workload: one recurrent step's matmul (batch x width by width x 4*width, the "
          "link the chain cannot split) reaches at most 50% of the matmul peak measured in the same run, so a chain of "
          "such steps can leave the machine idle. Models of equal size (the LSTMs' parameter counts within +-10% of "
          "the transformer's, measured), and a valid peak: no model's median utilisation above 100% of it.")
CHANGES = [
    {"date": "2026-11-30", "what": "threshold: a margin beyond the spread of repeated steps",
     "old": "Supported if the transformer's utilisation exceeds the looped LSTM's at every measured length.",
     "new": ("Supported if the transformer's utilisation exceeds the looped LSTM's at every measured length beyond the "
             "spread of the repeated steps (its lowest above the LSTM's highest); not supported if it is below beyond "
             "that spread at some length; inconclusive if the ranges overlap."),
     "why": ("The step time was the larger of 2 steps after a warm-up, with no spread; it is now the median of 3 "
             "(5 at full scale), and the verdict needs the ranges apart.")},
    {"date": "2026-12-02", "what": "prediction: the fused-kernel clause corrected; every clause decided; equal "
                                   "sizes; the regime (parallel hardware) stated and measured",
     "old": OLD_PREDICTION + (" Threshold: only the transformer vs the looped LSTM was decided; the LSTMs had width 360 "
                              "(2.2M parameters against the transformer's 3.3M)."),
     "new": PREDICTION + " Threshold: " + _THRESHOLD_RANGE + " Regime: " + REGIME,
     "why": ("Issue 29: decide() left out the fused-kernel clause, and the data refuted it: the fused LSTM reached 91% "
             "of the matmul peak against the transformer's 65% (quick run) and 65% against 46% (full run). The claim "
             "says 'an LSTM of equal size', and the fused kernel is one, so the transformer must beat it too; a "
             "wording that only asked the fused kernel to beat the loop was considered and dropped, since the two run "
             "the same FLOPs and it only compares a library kernel with a Python loop. The claim's mechanism needs "
             "hardware that one link of the chain cannot fill, which a few CPU cores may not be: that is now the "
             "measured regime. The LSTMs' width is searched to match the transformer's parameters within +-10%, and "
             "3 rounds (full scale, 3 timed steps each) must agree. Verdict before: supported (the refuted clause "
             "undecided); under the old wording, decided on the reference run's data: not supported.")},
    {"date": "2026-12-03", "what": "threshold: the spread is the middle half of 5 steps per round, not the full range of 3",
     "old": _THRESHOLD_RANGE, "new": _THRESHOLD_NO_MARGIN,
     "why": ("Issue 29: a verdict that one stray step can flip is not a finding, and the reference run of 51ff1f2 read "
             "inconclusive (unstable): the fused LSTM above the transformer beyond the full range in rounds 1 and 2, "
             "the ranges overlapping in round 3. With 3 steps a round the full range is all the spread there is, so "
             "one slow step (another process's turn on a shared machine) widens it as far as it goes; the middle half "
             "of 5 (timing.middle_half: the fastest and the slowest left out) does not move with one step. Claims 7 and "
             "16 made the same change. Verdict before: inconclusive (unstable); after: the next full run, where the "
             "verdict under the full range of the same 5 steps is shown beside it.")},
    {"date": "2026-12-04", "what": "threshold: 'busier' by a material margin (10%), not by any amount beyond the spread",
     "old": _THRESHOLD_NO_MARGIN, "new": THRESHOLD,
     "why": ("Issue 29: the reference at c6f02a9 read inconclusive (unstable) again, and its data show why: the "
             "transformer and the fused LSTM are at parity here (n=64: 43-44% vs 43-45%; n=256: 51% vs 50-51%; "
             "n=1024: 47-51% vs 50-55%), so which side of the other's middle half each lands on is the machine's "
             "wobble from round to round (the fused step took 0.87, 0.97 and 0.87 s). A claim that one model keeps the "
             "machine busier is a claim of a material difference; parity within 10% is not it, and a margin lets "
             "the data decide that in every round. Verdict before: inconclusive (unstable: not supported, "
             "inconclusive, not supported). After, decided on the same data: not supported in each of the 3 rounds "
             "(at n=64 the transformer's upper quartile, 43.6-44.1%, is below 1.1x the fused LSTM's lower quartile, "
             "47-49%); the verdict without the margin is shown beside it.")},
    {"date": "2026-12-05", "what": "method: the looped LSTM's backward pass does T steps of work, not T^2",
     "old": ("The loop read each step's input projection as xw[:, t]; the backward of each such read writes a zero "
             "tensor of the whole (batch, T, 4*width) projection, so a training step did T^2 work beside the chain."),
     "new": ("The loop reads them with unbind (its backward stacks the T gradients once), as the SSM's loop already "
             "did; the same chain of T dependent steps, the same gradients (tested against the fused kernel)."),
     "why": ("A fault in the measured code, found while looking for the report's time: the looped LSTM's step at "
             "n=1024 took 13.8 s (reference 19e67a4) and takes 2.2 s, and its share of the peak fell with length "
             "(18%, 12%, 3% at n=64, 256, 1024) only because of that extra work; it is now flat (22%, 24%, 24%). The "
             "claim is about the chain, not about a quadratic slip in how it was written. Prediction, threshold and "
             "regime unchanged. Verdict before: not supported (the fused LSTM at parity with the transformer); after, "
             "in a full run of claim 2 alone: not supported (n=1024: transformer 48%, loop 24%, fused 56%).")},
    {"date": "2026-12-07", "what": "method: the matmul peak is the faster library's and is read after every round",
     "old": ("The peak: the better of two readings of MKL's 2048 x 2048 product (torch's matmul), one before the runs "
             "and one after."),
     "new": ("The peak: the best of readings of the faster of MKL's and oneDNN's 2048 x 2048 products (timing."
             "matmul_peak with onednn, as the benchmarks read it), one before the first round and one after every "
             "round of the models at every length (10 readings at full scale)."),
     "why": ("Issue 29: the reference at 9b44d43 read inconclusive (regime not reached) because in round 1 the fused "
             "LSTM's median step at n=1024 was 100.4% of the peak, which fails the REGIME's 'valid peak' condition, "
             "while rounds 2 and 3 were valid and the data of all three read not supported: a verdict that flips "
             "on the calibration is not a finding. The peak there read 158.8 GFLOP/s; the same machine's fastest "
             "library reads 199-218 GFLOP/s (oneDNN, which torch's fused CPU LSTM also calls), and two readings of "
             "MKL alone could both land in one of the VM's slow spells. Prediction, threshold and regime's wording "
             "unchanged; the regime's first measured condition (one recurrent step's matmul over the peak, <= 50%) "
             "is divided by the higher peak too: 39-41% in the reference's rounds, 30-36% in the run below. "
             "Verdict before: inconclusive (regime not reached; 9b44d43, the data alone: not supported in each "
             "round); after, in a full run of claim 2 alone (10 readings, 198.7-218.5 GFLOP/s): not supported in "
             "each of the 3 rounds (n=1024: transformer 50-51%, loop 27-34%, fused 73-76%; the highest median "
             "share 76%).")},
]
EST_S = {"quick": 20, "full": 125}  # seconds on a 2-core CPU: the report's progress estimate
ROUNDS = {"quick": 1, "full": FULL_REPEATS}
REPEATS = 5  # timed steps per model, length and round: their middle half is the spread (timing.middle_half)
MATCH = 0.10  # the REGIME: parameter counts within +-10%
PEAK_S = 0.3  # seconds per library in each peak reading (timing.matmul_peak)
TRANSFORMER = ModelConfig(dim=256, n_layers=4, n_heads=4)


def _stepper(model, x):
    opt = make_optimizer(model, TrainConfig())

    def step():
        loss = lm_loss(model(x)[0], x)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def matched_lstm(fused: bool) -> ModelConfig:
    """The 2-layer LSTM whose parameter count is closest to the transformer's (width searched in steps of 8)."""
    target = count_params(build_model(TRANSFORMER, "meta"))
    cfg = lambda d: ModelConfig(family="lstm", dim=d, n_layers=2, fused=fused)
    return cfg(min(range(64, 1025, 8), key=lambda d: abs(count_params(build_model(cfg(d), "meta")) - target)))


def _step_matmul_share(cfg: ModelConfig, batch: int, peak: float, device) -> float:
    """Share of the peak one recurrent step's matmul (h @ W_hh^T: batch x width by width x 4*width) reaches: how
    much of the machine one link of the chain can fill (context for the fused kernel's result)."""
    h, w = torch.randn(batch, cfg.dim, device=device), torch.randn(4 * cfg.dim, cfg.dim, device=device)
    t = time_calls(lambda: h @ w.t(), 50, warmup=5, device=device)["median_s"]
    return 2 * batch * cfg.dim * 4 * cfg.dim / t / peak


def measure(scale: str, device: str) -> dict:
    lens = [64, 256] if scale == "quick" else [64, 256, 1024]
    batch, rounds = 8, ROUNDS[scale]
    cfgs = {"transformer": TRANSFORMER, "lstm (loop)": matched_lstm(False), "lstm (fused)": matched_lstm(True)}
    readings = [matmul_peak(device, seconds=PEAK_S, onednn=True)]
    rows = [[] for _ in range(rounds)]
    params = {}
    for T in lens:
        steps, flops = {}, {}
        for name, cfg in cfgs.items():
            torch.manual_seed(0)
            model = build_model(cfg, device)
            params[name] = count_params(model)
            steps[name] = _stepper(model, torch.randint(0, 256, (batch, T)).to(device))
            steps[name]()  # warm-up, once per model and length
            flops[name] = 3 * forward_flops(from_model_config(cfg), T, batch=batch)["total"]
        for r in range(rounds):  # rounds alternate the models, so a slow spell of the machine hits all of them
            for name in cfgs:
                t = time_calls(steps[name], REPEATS, warmup=0, device=device)
                rows[r].append({"round": r + 1, "model": name, "params": params[name], "dim": cfgs[name].dim, "n": T,
                                "step_s": t["median_s"], "step_lo_s": t["lo_s"], "step_hi_s": t["hi_s"],
                                "step_min_s": t["min_s"], "step_max_s": t["max_s"],
                                "tok_per_s": batch * T / t["median_s"], "step_flops": flops[name]})
            # a reading after every round of the models: the pace the machine had while they ran, not only at the
            # start and the end (a reading taken in a slow spell understated the peak, and a fast step then read
            # above 100% of it: CHANGES 2026-12-07)
            readings.append(matmul_peak(device, seconds=PEAK_S, onednn=True))
    peak = max(readings)
    for r in (r for rnd in rows for r in rnd):
        r.update({"share_of_peak": r["step_flops"] / r["step_s"] / peak,
                  "share_low": r["step_flops"] / r["step_hi_s"] / peak,  # the middle half: the THRESHOLD's spread
                  "share_high": r["step_flops"] / r["step_lo_s"] / peak,
                  "share_min": r["step_flops"] / r["step_max_s"] / peak,  # the full range: the old threshold's
                  "share_max": r["step_flops"] / r["step_min_s"] / peak})
    shares = [_step_matmul_share(cfgs["lstm (fused)"], batch, peak, device) for _ in rows]  # one per round
    return {"matmul_peak_flops": peak, "peak_readings": readings, "lengths": lens, "params": params,
            "step_matmul_share": max(shares),
            "rounds": [{"lengths": lens, "params": params, "rows": rnd, "step_matmul_share": sh}
                       for rnd, sh in zip(rows, shares)]}


def _above(hi: dict, lo: dict, spread=("share_low", "share_high"), margin: float = MATERIAL):
    """True: ``hi`` above (1 + margin) x ``lo`` beyond the spread (by default the middle half; ("share_min",
    "share_max"): the full range); False: below (1 + margin) x ``lo`` beyond it; None: neither."""
    low, high = spread
    if hi[low] > lo[high] * (1 + margin):
        return True
    return False if hi[high] < lo[low] * (1 + margin) else None


def _all(outcomes: list):
    return False if False in outcomes else (None if None in outcomes else True)


def regime(rnd: dict) -> list[dict]:
    p = rnd["params"]
    out = [condition(f"{name} parameters / transformer's", p[name] / p["transformer"], f"within 1 +- {MATCH}",
                     abs(p[name] / p["transformer"] - 1) <= MATCH,
                     f"{p[name] / 1e6:.2f}M / {p['transformer'] / 1e6:.2f}M")
           for name in ("lstm (loop)", "lstm (fused)") if name in p]
    if "step_matmul_share" in rnd:
        sh = rnd["step_matmul_share"]
        out.append(condition("one recurrent step's matmul / peak", sh, f"<= {PARALLEL:.0%} (parallel hardware)",
                             sh <= PARALLEL, f"{sh:.0%}"))
    top = max(rnd["rows"], key=lambda r: r["share_of_peak"])
    out.append(condition("highest median utilisation", top["share_of_peak"], "<= 100% of the measured peak",
                         top["share_of_peak"] <= 1.0, f"{top['share_of_peak']:.0%} ({top['model']}, n={top['n']})"))
    return out


FULL_RANGE = ("share_min", "share_max")  # the old threshold's spread (CHANGES 2026-12-03)


def _clauses(rnd: dict, spread=("share_low", "share_high"), margin: float = MATERIAL) -> dict:
    """Each clause of the prediction at each length: {clause: (outcome, [reason per length])}, the spreads compared
    being ``spread`` with ``margin`` (see ``_above``)."""
    by = {(r["model"], r["n"]): r for r in rnd["rows"]}
    pairs = {"transformer above the loop": ("transformer", "lstm (loop)"),
             "transformer above the fused": ("transformer", "lstm (fused)"),
             "fused above the loop (narrows the gap: old wording)": ("lstm (fused)", "lstm (loop)")}
    word = {True: "yes", False: "no", None: "spreads overlap"}
    lo, hi = spread
    out = {}
    for clause, (a, b) in pairs.items():
        res = [(_above(by[(a, T)], by[(b, T)], spread, margin), T) for T in rnd["lengths"]]
        out[clause] = (_all([o for o, _ in res]), [
            f"n={T}: {a} {by[(a, T)]['share_of_peak']:.1%} ({by[(a, T)][lo]:.1%}-{by[(a, T)][hi]:.1%})"
            f" > {1 + margin:g} x {b} {by[(b, T)]['share_of_peak']:.1%} ({by[(b, T)][lo]:.1%}-{by[(b, T)][hi]:.1%}): "
            f"{word[o]}" for o, T in res])
    return out


def _figure(rnd: dict) -> str:
    T = rnd["lengths"][-1]
    share = {r["model"]: r["share_of_peak"] for r in rnd["rows"] if r["n"] == T}
    return (f"share of matmul peak at n={T}: transformer {share['transformer']:.0%}, LSTM loop {share['lstm (loop)']:.0%}"
            f", fused {share['lstm (fused)']:.0%}")


def decide_one(rnd: dict, old: bool = False, spread=("share_low", "share_high"), margin: float = MATERIAL) -> Decision:
    """One round; ``old``: decided under the old wording (the fused kernel narrows the gap, too); ``spread`` and
    ``margin``: see ``_above`` (FULL_RANGE and 0: the thresholds before 2026-12-03 and 2026-12-04)."""
    c = _clauses(rnd, spread, margin)
    used = list(c) if old else list(c)[:2]  # the old wording's three clauses are the new two and "narrows"
    reasons = [line for name in c for line in c[name][1]]
    ok = _all([c[name][0] for name in used])
    reasons.append("; ".join(f"{name}: {({True: 'yes', False: 'no', None: 'overlap'})[c[name][0]]}" for name in c)
                   + f" -> {verdict(ok)}" + (" (old wording)" if old else ""))
    return Decision(verdict(ok), _figure(rnd), reasons)


def decide_old(measured: dict) -> Decision:
    """The verdict under the prediction's old wording ("narrows but does not close the gap": the transformer above both,
    the fused above the loop), shown beside the new."""
    return over_repeats([in_regime(regime(r), decide_one(r, old=True)) for r in measured["rounds"]])


def decide_full_range(measured: dict) -> Decision | None:
    """The verdict under the threshold before 2026-12-03 (the full range of the steps, not their middle half), shown
    beside the current one; None for runs that did not record the full range apart."""
    if not all("share_min" in r for rnd in measured["rounds"] for r in rnd["rows"]):
        return None
    return over_repeats([in_regime(regime(r), decide_one(r, spread=FULL_RANGE, margin=0.0)) for r in measured["rounds"]])


def decide_no_margin(measured: dict) -> Decision:
    """The verdict under the threshold before 2026-12-04 (beyond the middle half by any amount), shown beside."""
    return over_repeats([in_regime(regime(r), decide_one(r, margin=0.0)) for r in measured["rounds"]])


def decide(measured: dict) -> Decision:
    d = over_repeats([in_regime(regime(r), decide_one(r)) for r in measured["rounds"]])
    old = decide_old(measured)
    d.reasons.append(f"under the old wording ({OLD_PREDICTION.split('; ')[-1]}): {old.label}")
    d.reasons.append(f"under the threshold before 2026-12-04 (above by any amount, no {MATERIAL:.0%} margin): "
                     f"{decide_no_margin(measured).label}")
    full = decide_full_range(measured)
    if full is not None:
        d.reasons.append(f"under the old threshold (the full range of the {REPEATS} steps, not their middle half): "
                         f"{full.label}")
    return d


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    lens, rows = m["lengths"], [r for rnd in m["rounds"] for r in rnd["rows"]]
    first = m["rounds"][0]["rows"]
    names = list(dict.fromkeys(r["model"] for r in first))
    col = lambda name, key: [r[key] for r in first if r["model"] == name]
    data = {**m, "verdict_old_wording": decide_old(m).label}
    return Outcome.of(decide(m), data,
                      [Plot("Achieved share of matmul peak (training, round 1)", "n (tokens)", "share",
                            [Series(k, lens, col(k, "share_of_peak")) for k in names]),
                       Plot("Training throughput (round 1)", "n (tokens)", "tokens/s",
                            [Series(k, lens, col(k, "tok_per_s")) for k in names], log_y=True)],
                      rows, ["A 2-core CPU has little parallelism to sell: wall-clock speed can still favour the fused "
                             "LSTM (see the throughput plot); utilisation is the claim here.",
                             "FLOPs are the analytic count (matmuls only); a share above 100% means the peak "
                             "calibration (a large square matmul) understates what this machine reaches, and puts the "
                             "run outside the regime.",
                             f"Step time: median of {REPEATS} steps per round after one warm-up step, "
                             f"{len(m['rounds'])} round(s) alternating the models; the table gives each round's middle "
                             "half (share_low / share_high: the spread the verdict compares) and full range "
                             "(share_min / share_max)."])

"""Claim 3: attention connects any two positions in one step; recurrence passes signals through every step between.

Two halves, each repetition (a seed) decided alone and the repetitions required to agree: (a) the gradient of the
last position's loss with respect to each input, at initialisation, in float64 (in fp32 a recurrence's far
gradient underflows to exactly 0, which no ratio can be read from); (b) marked recall at distance d, trained with
Zoology's recipe (recall.py, ``task="marked"``): one token carried across d dependent steps, nothing else to store,
so distance is all that varies (how many bindings a fixed state holds is claim 8's MQAR), each family's
learning-rate sweep extended until its best rate is inside it.
"""
import torch

from attnlab.config import ModelConfig
from attnlab.experiments import recall
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, in_regime, mean, over_repeats,
                                      verdict)
from attnlab.models import build_model

TITLE = "Constant path length"
CLAIM = ("Self-attention's maximum path length is O(1), a recurrent network's O(n): gradients reach distant inputs "
         "undiminished in a transformer and decay with distance in rnn/lstm/gru, and recall at a distance follows.")
PREDICTION_MQAR = ("(a) At initialisation, the gradient of the last position's loss with respect to the input d steps back "
              "falls by orders of magnitude over d for rnn, lstm and gru, and stays within an order of magnitude for the "
              "transformer. (b) With equal parameters (+-10%), heads, data and a learning-rate sweep per family "
              "(Zoology's MQAR recipe), the transformer recalls best at the largest number of key-value pairs, and its "
              "accuracy does not fall with key-query distance.")
THRESHOLD_MQAR = ("Decided per seed (3 at full scale), the seeds required to agree. Supported if (a) the transformer's "
             "far/near gradient ratio (float64) is >= 0.1 and every recurrent family's is <= 0.01, and (b) the "
             "transformer's MQAR test accuracy at the largest pair count is above every other family's by more than "
             "5 points and its far-half accuracy is within 5 points of its near half. Not supported if a check fails "
             "(a recall difference the other way beyond 5 points); inconclusive if a recall difference is within 5 "
             "points or the seeds disagree.")
REGIME_MQAR = ("Recall is compared only between models that learned the task (each family compared >= 50% MQAR accuracy "
          "at the smallest pair count, that seed), each trained at a learning rate inside its sweep (the best rate "
          "not at an end: a rate at the end may be the best only of too narrow a sweep); gradients are compared only "
          "where they are measurable (every norm > 0: no underflow).")
REGIME_OLD = ("Recall is compared only between models that learned the task (the best family >= 50% MQAR accuracy at "
              "the smallest pair count, that seed), each trained at a learning rate inside its sweep (the best rate not "
              "at an end: a rate at the end may be the best only of too narrow a sweep); gradients are compared only "
              "where they are measurable (every norm > 0: no underflow).")

CHANGES = [
    {"date": "2026-11-29", "what": "An inconclusive gate was added after the first results were seen.",
     "old": "Supported if the transformer's far/near gradient ratio is >= 10x every recurrent family's, and its MQAR "
            "accuracy is >= every other family's.",
     "new": "... ; inconclusive if no family reaches 50% MQAR accuracy (too little training to compare recall).",
     "why": "Every family sat near chance (20-34%), so ranking them compared noise. Recorded here on 2026-11-30: the "
            "change was not written down when it was made (verdict then: inconclusive)."},
    {"date": "2026-11-30", "what": "Recall trained per Zoology's recipe; the gradient half given absolute thresholds.",
     "old": "(b) With equal parameters and training budget, the transformer's MQAR accuracy is the highest and does "
            "not fall with key-query distance. Threshold: the transformer's far/near gradient ratio is >= 10x every "
            "recurrent family's, and its MQAR accuracy is >= every other family's; inconclusive if no family reaches 50%.",
     "new": "(b) With equal parameters (+-10%), heads, data and a learning-rate sweep per family (Zoology's MQAR recipe), the transformer recalls best at the largest number of key-value pairs, and its accuracy does not fall with key-query distance. Threshold: Supported if (a) the transformer's far/near gradient ratio is >= 0.1 and every recurrent family's is <= 0.01, and (b) the transformer's MQAR test accuracy at the largest pair count is above every other family's by more than the seed spread and its far-half accuracy is within 5 points of its near half. Not supported if a check fails; inconclusive if no family reaches 50% MQAR accuracy (too little training to compare recall) or a recall difference is within the seed spread.",
     "why": "The recurrent ratios underflow to exactly 0 at init, so '>= 10x theirs' passed any transformer ratio; "
            "absolute bounds on both sides can fail. The transformer had 1 head and the others 4, parameter counts "
            "differed up to 5x, one learning rate, 200 steps: nobody learned MQAR (verdict: inconclusive). Now: the "
            "same heads, parameters within 10%, a sweep, seeds, and the margin must beat the seed spread."},
    recall.SSM_INIT_CHANGE,  # recorded while claim 3 trained the SSM on MQAR with claim 8
    {"date": "2026-12-02", "what": "method and threshold: float64 gradients, bracketed sweeps, per-seed verdicts, regime",
     "old": ("Gradients in fp32 on one initialisation; one learning-rate sweep (3e-4, 1e-3, 3e-3) whatever its best; "
             "recall differences against the seed spread of the means; inconclusive if no family reaches 50%."),
     "new": ("Gradients in float64 on each seed's initialisation; a sweep whose best rate is at an end is extended past "
             "it (up to 2 more rates, recall.next_rates), and an unbracketed best is an unmet regime condition; each "
             "seed decided alone with a 5-point recall margin, seeds required to agree; 'no family learned' and "
             "underflowed gradients are regime conditions. Threshold: " + THRESHOLD_MQAR),
     "why": ("Issue 29: the recurrent ratios underflowed to exactly 0 in fp32 (lstm, gru, rnn at d = 128 and 255), so "
             "the '<= 0.01' check could not fail for them; a best rate at an end of the sweep may be an artefact of "
             "the sweep. A per-seed verdict shows whether the result holds across seeds rather than on their mean. "
             "Verdict before: supported (full scale); after: see the report (full scale not rerun in this change).")},
]

GRADIENT_FAMILIES = {"transformer": {}, "lstm": dict(family="lstm"), "gru": dict(family="gru"), "rnn": dict(family="rnn"),
                     "ssm": dict(family="ssm", pos="none"), "linear": dict(family="linear", pos="none")}
# The recurrences the claim names; quick scale trains two of them to keep the quick report inside its 5 minutes.
RECALL_FAMILIES = {"quick": ("transformer", "lstm", "rnn"), "full": ("transformer", "lstm", "gru", "rnn")}
RECURRENT = ("rnn", "lstm", "gru")
CHANGES.append(
    {"date": "2026-12-05", "what": "regime: every family compared must have learned the task, not the best one",
     "old": REGIME_OLD, "new": REGIME_MQAR,
     "why": ("Issue 29's independent read: the regime said recall is compared only between models that learned the "
             "task but checked the best family alone, and in the reference no family but the transformer had "
             "learned it: at 4 pairs the rnn scored 2% (chance), the lstm 3-20%, the gru, linear attention and the "
             "SSM 28-43% (about what guessing among the 4 values in the context gives), against the transformer's "
             "100% (679adec). 'The transformer recalls best' then compared a trained model with baselines that never "
             "formed the lookup, which says nothing about path length. The rule is to fix the training, not the "
             "threshold: until the recurrent families learn the small case, the recall half is outside its regime, "
             "and since each seed is decided whole, so is the seed's gradient half (measured at initialisation, and "
             "shown). Prediction and threshold unchanged. Verdict before: supported (679adec, 3 of 3 seeds); after, on the "
             "same data: inconclusive (regime not reached).")})
CHANGES.append(recall.SHORT_CONV_CHANGE)  # recorded while claim 3 trained claim 8's MQAR models
PREDICTION = ("(a) At initialisation, the gradient of the last position's loss with respect to the input d steps "
              "back falls by orders of magnitude over d for rnn, lstm and gru, and stays within an order of magnitude "
              "for the transformer. (b) With equal parameters (+-10%), heads, data and a learning-rate sweep per family, "
              "trained to recall a marked token after d tokens drawn from the same range (tested from d = 1 to 3T/4), "
              "the transformer's accuracy does not fall with d, and each of rnn, lstm and gru recalls less at the far "
              "distances (d > T/2) than at d = 1.")
THRESHOLD = ("Decided per seed (3 at full scale), the seeds required to agree. Supported if (a) the transformer's "
             "far/near gradient ratio (float64) is >= 0.1 and every recurrent family's is <= 0.01, and (b) the "
             "transformer's mean accuracy over the far distances is within 5 points of its accuracy at d = 1, and "
             "every recurrent family's is below its own accuracy at d = 1 by more than 5 points. Not supported if a "
             "check fails (the transformer's recall falls, or a recurrent family's does not).")
REGIME = ("Recall at a distance is judged only for models that learned the task (each family >= 50% at d = 1, that "
          "seed: a family that never recalls anything has no distance to lose it over), each trained at a learning "
          "rate inside its sweep (the best rate not at an end); gradients are compared only where they are "
          "measurable (every norm > 0: no underflow).")
CHANGES.append(
    {"date": "2026-12-06", "what": "method, prediction (b), threshold and regime: recall at a distance measured on "
                                   "marked recall, not MQAR",
     "old": PREDICTION_MQAR + " Threshold: " + THRESHOLD_MQAR + " Regime: " + REGIME_MQAR,
     "new": PREDICTION + " Threshold: " + THRESHOLD + " Regime: " + REGIME,
     "why": ("Issue 29: in every reference run the recurrent families never learned MQAR at the transformer's "
             "parameter count (at 4 pairs rnn 2%, lstm 3-20%, gru 29%: guessing among the values in context, "
             "fbf4448), so the recall half never reached its regime. Training was not the cause: a gru trained "
             "12.5x longer (15,000 steps) on the easiest curriculum stayed at 51 / 28 / 18% at 2 / 4 / 8 pairs; "
             "twice the width, no filler and a single query did not help either. MQAR asks how many key-value "
             "bindings a model holds, which is state capacity (claim 8 keeps it); the claim's recall clause is "
             "about distance. Marked recall varies the distance alone: one token to carry across d dependent steps, "
             "every other token from the same range, nothing else to store. Probes while designing it (not the "
             "reported runs; T = 64 unless said): with marks placed uniformly the far distances were hardly trained and the transformer "
             "fell to 57-83% at d = 62 of T = 64 on two seeds of three, so half the marks now sit in the first "
             "quarter; with 8 queries a sequence and 1,500 steps the tanh rnn stayed at 3% at d = 1 on one seed "
             "(1e-3), with 2,000 steps it reached 47, 70 and 66% on three seeds (3e-4), so 12 queries and 2,000 "
             "steps (62% on the seed that had 47%; 58-71% on three seeds in a full-scale run at T = 48; <= 6% from "
             "d = 4 in every probe). A distance near T - 2 still needs a mark in the first "
             "positions, which training draws rarely: in a full-scale run at T = 64 the transformer (3e-3) held "
             "96-100% to d = 32 and fell to 29-76% at d = 62 on two seeds, and at T = 48 it fell to 53-95% at d = 46 "
             "while holding 97-100% to d = 36; so T = 48 and distances tested up to 3T/4 = 36. The lstm and gru were "
             "at 98-100% at every distance in every probe (the gru also at T = 128, to d = 126) but one lstm seed "
             "(80% at d = 1, 26% at d = 62). So the gated families are expected to refute part (b) and the tanh "
             "rnn to support it; written here before the full-scale run. The gradient half is "
             "unchanged. Verdict before: inconclusive (regime not reached; fbf4448); after: the reference run that "
             "follows this change.")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: the LSTM's and the tanh RNN's sweeps start at the rates around their best "
                                   "(prediction, threshold and regime unchanged)",
     "old": "every family's sweep starts at 3e-4, 1e-3, 3e-3, extended past an end while the best sits there",
     "new": "the LSTM's starts at 1e-3, 3e-3, 9e-3 and the tanh RNN's at 9e-5, 3e-4, 1e-3 (the same extension rule)",
     "why": ("The report must fit in an hour on 2 cores. In the reference at c5f2b2d both sweeps were extended once "
             "(LSTM: 3e-4 0.56, 1e-3 1.00, 3e-3 1.00, 9e-3 1.00 validation accuracy, best 3e-3; RNN: 9e-5 0.021, "
             "3e-4 0.120, 1e-3 0.012, 3e-3 0.007, best 3e-4): starting at the three rates around each best trains "
             "the same rates on the same seed without the one farthest away (about 75 job-seconds). Verdict before: "
             "not supported (2a35378); after: the reference run that follows this change.")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: the transformer's sweep starts at the rates around its best (prediction, "
                                   "threshold and regime unchanged)",
     "old": "the transformer's sweep starts at 3e-4, 1e-3, 3e-3, extended past an end while the best sits there",
     "new": "it starts at 1e-3, 3e-3, 9e-3 (the same extension rule)",
     "why": ("The report must fit in an hour on 2 cores (71 min on a 2-core AMD EPYC at 3c4b14b). There the sweep was "
             "extended once (3e-4 0.980, 1e-3 0.976, 3e-3 0.997, 9e-3 0.028 validation accuracy, best 3e-3): starting "
             "at the three rates around the best trains the same rates on the same seed without the one farthest "
             "away (about 55 job-seconds). Verdict before: not supported (3c4b14b); after: the reference run that "
             "follows this change.")})
CHANGES.append(recall.SSM_GATE_CHANGE)  # the SSM whose gradient at initialisation this claim shows (not decided)
EST_S = {"quick": 2, "full": 60}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 30, "full": 460}  # this claim's share of the training stage (training.py), in seconds
MARGIN = 0.05  # recall: a fall from d = 1 to the far distances counts when larger than this
LEARNED = 0.5  # the REGIME: each family's accuracy at d = 1
SEEDS = {"quick": (0,), "full": (0, 1, 2)}  # gradient initialisations; recall trains recall.MARKED[scale].seeds


def _grad_profile(kw, T, dists, device, seed=0):
    """|dL/dx| at each distance back from the last position, at initialisation, in float64 (fp32 underflows)."""
    torch.manual_seed(seed)
    model = build_model(ModelConfig(dim=64, n_layers=2, n_heads=4, max_seq_len=T, **kw), device).double()
    x = torch.randint(0, 256, (4, T)).to(device)  # drawn on the CPU: the same inputs on every device
    emb = model.tok_emb(x).detach().requires_grad_(True)
    hook = model.tok_emb.register_forward_hook(lambda m, i, o: emb)  # feed our leaf tensor as the embedding
    logits, _ = model(x)
    hook.remove()
    torch.nn.functional.cross_entropy(logits[:, -1], x[:, 0]).backward()
    norms = emb.grad.norm(dim=-1).mean(0)  # (T,)
    return [float(norms[T - 1 - d]) for d in dists]


def training(scale: str, device: str) -> dict:
    """The recall models this claim compares, for the report's training stage (training.py)."""
    return recall.tasks(RECALL_FAMILIES[scale], scale, device, task="marked")


def measure(scale: str, device: str) -> dict:
    T = 64 if scale == "quick" else 256
    dists = [d for d in (1, 2, 4, 8, 16, 32, 63, 128, 255) if d < T]
    grads = [{name: _grad_profile(kw, T, dists, device, seed) for name, kw in GRADIENT_FAMILIES.items()}
             for seed in SEEDS[scale]]
    recall.prefetch(RECALL_FAMILIES[scale], scale, device, task="marked")  # done by the training stage, unless alone
    return {"distances": dists, "grad_dtype": "float64", "grad_norms": grads[0], "grad_norms_by_seed": grads,
            "recall_task": "marked", "recall_setup": recall.setup_dict(scale, "marked"),
            "recall": {name: recall.summary(name, scale, device, "marked") for name in RECALL_FAMILIES[scale]}}


def _ratios(g: dict) -> dict:
    return {f: v[-1] / v[0] if v[0] > 0 else float("nan") for f, v in g.items()}


def _by_distance(m: dict, family: str, i: int) -> tuple[float, float]:
    """Seed ``i``'s accuracy at the nearest distance (d = 1) and its mean over the far distances (d > T/2)."""
    test = recall.by_int(m["recall"][family]["test"])
    half = m["recall_setup"]["seq_len"] // 2
    at = lambda d: test[d][min(i, len(test[d]) - 1)]["acc"]
    far = [at(d) for d in test if d > half]
    return at(min(test)), mean(far)


def regime(m: dict, i: int) -> list[dict]:
    """Repetition ``i``'s conditions: gradients measurable, the task learned, every sweep bracketing its best rate."""
    g = m["grad_norms_by_seed"][i]
    low = min(min(v) for v in g.values())
    out = [condition("smallest gradient norm", low, "> 0 (no underflow)", low > 0, f"{low:.2g}")]
    missing = [f for f in RECURRENT if f not in m["recall"]]
    out.append(condition("recurrent families trained", ", ".join(f for f in RECURRENT if f in m["recall"]),
                         "every one the claim names (" + ", ".join(RECURRENT) + ")", not missing))
    for f in m["recall"]:  # a family that recalls nothing has no distance to lose it over
        near, _ = _by_distance(m, f, i)
        out.append(condition(f"{f}'s accuracy at d = 1", near, f">= {LEARNED:.0%} (it learned the task)",
                             near >= LEARNED, f"{near:.0%}"))
    for f, r in m["recall"].items():
        rates = sorted(float(k) for k in r.get("lr_sweep", {}))
        out.append(condition(f"{f} learning-rate sweep brackets its best", r["best_lr"],
                             "the best rate inside a sweep of >= 3", recall.bracketed(r.get("lr_sweep", {}), r["best_lr"]),
                             f"best {float(r['best_lr']):.2g} of " + ", ".join(f"{x:.2g}" for x in rates)))
    return out


def decide_one(m: dict, i: int) -> Decision:
    """Seed ``i``: its initialisation's gradients and its trained models' recall by distance."""
    ratio = _ratios(m["grad_norms_by_seed"][i])
    grad_ok = ratio["transformer"] >= 0.1 and all(ratio[f] <= 0.01 for f in RECURRENT)
    reasons = [f"gradient far/near: transformer {ratio['transformer']:.2g} (>= 0.1?), "
               + ", ".join(f"{f} {ratio[f]:.2g}" for f in RECURRENT)
               + f" (each <= 0.01?): {'yes' if grad_ok else 'no'}"]
    acc = {f: _by_distance(m, f, i) for f in m["recall"]}
    near, far = acc["transformer"]
    flat = far >= near - MARGIN
    falls = {f: acc[f][0] - acc[f][1] > MARGIN for f in RECURRENT if f in acc}
    reasons.append(f"transformer at d = 1 / far: {near:.0%} / {far:.0%} (within {MARGIN:.0%}?): "
                   + ("yes" if flat else "no"))
    ok = grad_ok and flat and all(falls.values())
    # last: the recall comparison in one line (over_repeats quotes each repetition's last deciding reason)
    shown = ", ".join(f"{f} {a[0]:.0%} / {a[1]:.0%}" for f, a in acc.items())
    steady = [f for f, x in falls.items() if not x]
    reasons.append(f"seed {i}, accuracy at d = 1 / far: {shown}; recurrences whose recall falls by > 5 points: "
                   + (", ".join(f for f, x in falls.items() if x) or "none")
                   + (f"; not falling: {', '.join(steady)}" if steady else "")
                   + f"; gradients {'ok' if grad_ok else 'fail'}; transformer flat: {'yes' if flat else 'no'}")
    figure = (f"gradient far/near: transformer {ratio['transformer']:.2g}, lstm {ratio['lstm']:.2g}; "
              f"recall at d = 1 / far: {shown}")
    return Decision(verdict(ok), figure, reasons)


def decide(m: dict) -> Decision:
    if m.get("recall_task") != "marked":
        raise ValueError("claim 3's measurement holds MQAR recall, from before recall at a distance moved to marked "
                         "recall: run `attnlab report --only 3` again to measure it")
    n = len(m["grad_norms_by_seed"])
    return over_repeats([in_regime(regime(m, i), decide_one(m, i)) for i in range(n)])


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    d = decide(m)
    rec, dists = m["recall"], m["distances"]
    at = sorted(int(p) for p in rec["transformer"]["test"])
    curve = {f: [mean([s["acc"] for s in recall.by_int(r["test"])[p]]) for p in at] for f, r in rec.items()}
    rows = [{"family": f, "params": r["params"], "dim": r["dim"], "best_lr": r["best_lr"],
             **{f"acc_d{p}": curve[f][i] for i, p in enumerate(at)},
             "lr_bracketed": r.get("lr_bracketed"),
             "grad_far_over_near": _ratios(m["grad_norms"])[f]} for f, r in rec.items()]
    s = recall.MARKED[scale]
    return Outcome.of(d, m, [
        Plot("Gradient norm vs distance (at init, float64, seed 0)", "distance d", "|dL/dx_{T-1-d}|",
             [Series(f, dists, v) for f, v in m["grad_norms"].items()], log_x=True, log_y=True),
        Plot("Recall of a marked token vs distance (mean over seeds)", "distance d (tokens)", "test accuracy",
             [Series(f, at, c) for f, c in curve.items()], log_x=True)], rows,
        [f"Marked recall: sequences of {s.seq_len} tokens, vocabulary {s.vocab}; a marker, the value after it, then "
         f"queries asking for the value up to {s.seq_len - 2} tokens later, every other token from the value's own "
         f"range; {s.n_queries} queries a training sequence, half its marks in the first quarter; one query a test "
         f"sequence ({s.test_n} per distance, tested to {max(s.test_distances)}: the distances near {s.seq_len - 2} "
         "need a mark in the first positions, which training draws rarely). "
         f"{s.steps} steps of {s.batch}; learning rates {s.lrs} swept on seed 0 ("
         + "".join(f"{n}'s from {s.lrs_of(n)}, " for n, _ in s.family_lrs)
         + "best on a validation draw; a best at "
         f"an end of the sweep extends it), then {s.seeds} seed(s) at the best; every family within 10% of the "
         "transformer's parameters. Recurrent families train through torch's fused kernel (the same recurrence)."])

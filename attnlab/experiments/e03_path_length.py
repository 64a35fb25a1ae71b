"""Claim 3: attention connects any two positions in one step; recurrence passes signals through every step between.

Two halves, each repetition (a seed) decided alone and the repetitions required to agree: (a) the gradient of the
last position's loss with respect to each input, at initialisation, in float64 (in fp32 a recurrence's far
gradient underflows to exactly 0, which no ratio can be read from); (b) MQAR recall after Zoology's recipe
(recall.py), each family's learning-rate sweep extended until its best rate is inside it.
"""
import torch

from attnlab.config import ModelConfig
from attnlab.experiments import recall
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, in_regime, mean, over_repeats, spread,
                                      verdict)
from attnlab.models import build_model

TITLE = "Constant path length"
CLAIM = ("Self-attention's maximum path length is O(1), a recurrent network's O(n): gradients reach distant inputs "
         "undiminished in a transformer and decay with distance in rnn/lstm/gru, and recall at a distance follows.")
PREDICTION = ("(a) At initialisation, the gradient of the last position's loss with respect to the input d steps back "
              "falls by orders of magnitude over d for rnn, lstm and gru, and stays within an order of magnitude for the "
              "transformer. (b) With equal parameters (+-10%), heads, data and a learning-rate sweep per family "
              "(Zoology's MQAR recipe), the transformer recalls best at the largest number of key-value pairs, and its "
              "accuracy does not fall with key-query distance.")
THRESHOLD = ("Decided per seed (3 at full scale), the seeds required to agree. Supported if (a) the transformer's "
             "far/near gradient ratio (float64) is >= 0.1 and every recurrent family's is <= 0.01, and (b) the "
             "transformer's MQAR test accuracy at the largest pair count is above every other family's by more than "
             "5 points and its far-half accuracy is within 5 points of its near half. Not supported if a check fails "
             "(a recall difference the other way beyond 5 points); inconclusive if a recall difference is within 5 "
             "points or the seeds disagree.")
REGIME = ("Recall is compared only between models that learned the task (each family compared >= 50% MQAR accuracy "
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
    recall.SSM_INIT_CHANGE,  # shared with claim 8: the same trained SSM
    {"date": "2026-12-02", "what": "method and threshold: float64 gradients, bracketed sweeps, per-seed verdicts, regime",
     "old": ("Gradients in fp32 on one initialisation; one learning-rate sweep (3e-4, 1e-3, 3e-3) whatever its best; "
             "recall differences against the seed spread of the means; inconclusive if no family reaches 50%."),
     "new": ("Gradients in float64 on each seed's initialisation; a sweep whose best rate is at an end is extended past "
             "it (up to 2 more rates, recall.next_rates), and an unbracketed best is an unmet regime condition; each "
             "seed decided alone with a 5-point recall margin, seeds required to agree; 'no family learned' and "
             "underflowed gradients are regime conditions. Threshold: " + THRESHOLD),
     "why": ("Issue 29: the recurrent ratios underflowed to exactly 0 in fp32 (lstm, gru, rnn at d = 128 and 255), so "
             "the '<= 0.01' check could not fail for them; a best rate at an end of the sweep may be an artefact of "
             "the sweep. A per-seed verdict shows whether the result holds across seeds rather than on their mean. "
             "Verdict before: supported (full scale); after: see the report (full scale not rerun in this change).")},
]

GRADIENT_FAMILIES = {"transformer": {}, "lstm": dict(family="lstm"), "gru": dict(family="gru"), "rnn": dict(family="rnn"),
                     "ssm": dict(family="ssm", pos="none"), "linear": dict(family="linear", pos="none")}
# Quick scale trains one recurrence (lstm) and one fixed-state attention (linear) to keep the quick report inside
# its 5 minutes; the SSM (~0.1 s a training step here with the compiled scan, 0.34 s without) and gru/rnn are
# trained at full scale.
RECALL_FAMILIES = {"quick": ("transformer", "lstm", "linear"),
                   "full": ("transformer", "lstm", "gru", "rnn", "ssm", "linear")}
RECURRENT = ("rnn", "lstm", "gru")
CHANGES.append(
    {"date": "2026-12-05", "what": "regime: every family compared must have learned the task, not the best one",
     "old": REGIME_OLD, "new": REGIME,
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
CHANGES.append(recall.SHORT_CONV_CHANGE)  # shared with claim 8: the same trained models
EST_S = {"quick": 2, "full": 60}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 30, "full": 1000}  # this claim's share of the training stage (training.py), in seconds
MARGIN = 0.05  # recall: the transformer ahead (or behind) by more than this to count; far half within this of near
LEARNED = 0.5  # the REGIME: each compared family's accuracy at the smallest pair count
SEEDS = {"quick": (0,), "full": (0, 1, 2)}  # gradient initialisations; recall trains recall.SETUPS[scale].seeds


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
    return recall.tasks(RECALL_FAMILIES[scale], scale, device)


def measure(scale: str, device: str) -> dict:
    T = 64 if scale == "quick" else 256
    dists = [d for d in (1, 2, 4, 8, 16, 32, 63, 128, 255) if d < T]
    grads = [{name: _grad_profile(kw, T, dists, device, seed) for name, kw in GRADIENT_FAMILIES.items()}
             for seed in SEEDS[scale]]
    recall.prefetch(RECALL_FAMILIES[scale], scale, device)  # done by the training stage, unless run alone
    return {"distances": dists, "grad_dtype": "float64", "grad_norms": grads[0], "grad_norms_by_seed": grads,
            "recall_setup": recall.setup_dict(scale),
            "recall": {name: recall.summary(name, scale, device) for name in RECALL_FAMILIES[scale]}}


def _ratios(g: dict) -> dict:
    return {f: v[-1] / v[0] if v[0] > 0 else float("nan") for f, v in g.items()}


def regime(m: dict, i: int) -> list[dict]:
    """Repetition ``i``'s conditions: gradients measurable, the task learned, every sweep bracketing its best rate."""
    g = m["grad_norms_by_seed"][i]
    low = min(min(v) for v in g.values())
    rec = {f: recall.by_int(r["test"]) for f, r in m["recall"].items()}
    smallest = min(rec["transformer"])
    out = [condition("smallest gradient norm", low, "> 0 (no underflow)", low > 0, f"{low:.2g}")]
    for f, r in rec.items():  # every family compared: a comparison with one that never learned says nothing
        a = r[smallest][min(i, len(r[smallest]) - 1)]["acc"]
        out.append(condition(f"{f}'s accuracy at {smallest} pairs", a, f">= {LEARNED:.0%} (it learned the task)",
                             a >= LEARNED, f"{a:.0%}"))
    for f, r in m["recall"].items():
        rates = sorted(float(k) for k in r.get("lr_sweep", {}))
        out.append(condition(f"{f} learning-rate sweep brackets its best", r["best_lr"],
                             "the best rate inside a sweep of >= 3", recall.bracketed(r.get("lr_sweep", {}), r["best_lr"]),
                             f"best {float(r['best_lr']):.2g} of " + ", ".join(f"{x:.2g}" for x in rates)))
    return out


def decide_one(m: dict, i: int) -> Decision:
    """Seed ``i``: its initialisation's gradients and its trained models' recall."""
    ratio = _ratios(m["grad_norms_by_seed"][i])
    reasons = []
    grad_ok = ratio["transformer"] >= 0.1 and all(ratio[f] <= 0.01 for f in RECURRENT)
    reasons.append(f"gradient far/near: transformer {ratio['transformer']:.2g} (>= 0.1?), "
                   + ", ".join(f"{f} {ratio[f]:.2g}" for f in RECURRENT) + f" (each <= 0.01?): {'yes' if grad_ok else 'no'}")
    rec = {f: recall.by_int(r["test"]) for f, r in m["recall"].items()}
    top = max(rec["transformer"])
    at = {f: r[top][min(i, len(r[top]) - 1)] for f, r in rec.items()}
    wins = {f: (True if at["transformer"]["acc"] - a["acc"] > MARGIN else
                False if a["acc"] - at["transformer"]["acc"] > MARGIN else None)
            for f, a in at.items() if f != "transformer"}
    near, far = at["transformer"]["near"], at["transformer"]["far"]
    flat = None if far is None or near is None else far >= near - MARGIN  # no far-half probe: nothing to decide
    reasons.append(f"transformer near/far half at {top} pairs: "
                   + ("not measured" if flat is None else f"{near:.0%} / {far:.0%}")
                   + f" (far within 5 points?): {({True: 'yes', False: 'no', None: 'unknown'})[flat]}")
    if not grad_ok or flat is False or any(w is False for w in wins.values()):
        ok = False
    elif flat is None or any(w is None for w in wins.values()):
        ok = None
    else:
        ok = True
    # last: the recall comparison in one line (over_repeats shows each repetition's last reason)
    reasons.append(f"MQAR at {top} pairs, seed {i}: transformer {at['transformer']['acc']:.0%} vs "
                   + ", ".join(f"{f} {a['acc']:.0%}" for f, a in at.items() if f != "transformer")
                   + f"; ahead by > {MARGIN:.0%}: " + (", ".join(f for f, w in wins.items() if w) or "none")
                   + (f"; within {MARGIN:.0%}: " + ", ".join(f for f, w in wins.items() if w is None)
                      if None in wins.values() else "") + (f"; gradients {'ok' if grad_ok else 'fail'}")
                   + f"; far half flat: {({True: 'yes', False: 'no', None: 'unknown'})[flat]}")
    figure = (f"gradient far/near: transformer {ratio['transformer']:.2g}, lstm {ratio['lstm']:.2g}; MQAR at {top} pairs: "
              + ", ".join(f"{f} {a['acc']:.0%}" for f, a in at.items()))
    return Decision(verdict(ok), figure, reasons)


def decide(m: dict) -> Decision:
    n = len(m["grad_norms_by_seed"])
    return over_repeats([in_regime(regime(m, i), decide_one(m, i)) for i in range(n)])


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    d = decide(m)
    rec, dists = m["recall"], m["distances"]
    pairs = sorted(int(p) for p in rec["transformer"]["test"])
    curve = {f: [mean([s["acc"] for s in r["test"][p]]) for p in pairs] for f, r in rec.items()}
    rows = [{"family": f, "params": r["params"], "dim": r["dim"], "best_lr": r["best_lr"],
             **{f"acc_{p}_pairs": curve[f][i] for i, p in enumerate(pairs)},
             "acc_spread_top": spread([s["acc"] for s in r["test"][pairs[-1]]]),
             "near_top": mean([s["near"] for s in r["test"][pairs[-1]]]),
             "far_top": mean([s["far"] for s in r["test"][pairs[-1]] if s["far"] is not None] or [0.0]),
             "lr_bracketed": r.get("lr_bracketed"),
             "grad_far_over_near": _ratios(m["grad_norms"])[f]} for f, r in rec.items()]
    s = recall.SETUPS[scale]
    return Outcome.of(d, m, [
        Plot("Gradient norm vs distance (at init, float64, seed 0)", "distance d", "|dL/dx_{T-1-d}|",
             [Series(f, dists, v) for f, v in m["grad_norms"].items()], log_x=True, log_y=True),
        Plot("MQAR accuracy vs key-value pairs (Zoology's curve)", "key-value pairs", "test accuracy",
             [Series(f, pairs, c) for f, c in curve.items()])], rows,
        [f"MQAR: sequences of {s.seq_len} tokens, vocabulary {s.vocab}, 0-{s.filler[1]} irrelevant tokens among the "
         f"pairs, trained on {s.train_pairs} pairs for {s.steps} steps of {s.batch}; learning rates {s.lrs} swept on "
         f"seed 0 (best on a validation draw; a best at an end of the sweep extends it), then {s.seeds} seed(s) at the best; every family within 10% of the "
         "transformer's parameters, the same 4 heads where a mixer has heads. Recurrent families train through "
         "torch's fused kernel (the same recurrence)."])

"""Claim 3: attention connects any two positions in one step; recurrence passes signals through every step between."""
import torch

from attnlab.config import ModelConfig
from attnlab.experiments import recall
from attnlab.experiments.base import Decision, Outcome, Plot, Series, compare, mean, spread, verdict
from attnlab.models import build_model

TITLE = "Constant path length"
CLAIM = ("Self-attention's maximum path length is O(1), a recurrent network's O(n): gradients reach distant inputs "
         "undiminished in a transformer and decay with distance in rnn/lstm/gru, and recall at a distance follows.")
PREDICTION = ("(a) At initialisation, the gradient of the last position's loss with respect to the input d steps back "
              "falls by orders of magnitude over d for rnn, lstm and gru, and stays within an order of magnitude for the "
              "transformer. (b) With equal parameters (+-10%), heads, data and a learning-rate sweep per family "
              "(Zoology's MQAR recipe), the transformer recalls best at the largest number of key-value pairs, and its "
              "accuracy does not fall with key-query distance.")
THRESHOLD = ("Supported if (a) the transformer's far/near gradient ratio is >= 0.1 and every recurrent family's is "
             "<= 0.01, and (b) the transformer's MQAR test accuracy at the largest pair count is above every other "
             "family's by more than the seed spread and its far-half accuracy is within 5 points of its near half. "
             "Not supported if a check fails; inconclusive if no family reaches 50% MQAR accuracy (too little training "
             "to compare recall) or a recall difference is within the seed spread.")

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
     "new": PREDICTION[PREDICTION.index("(b)"):] + " Threshold: " + THRESHOLD,
     "why": "The recurrent ratios underflow to exactly 0 at init, so '>= 10x theirs' passed any transformer ratio; "
            "absolute bounds on both sides can fail. The transformer had 1 head and the others 4, parameter counts "
            "differed up to 5x, one learning rate, 200 steps: nobody learned MQAR (verdict: inconclusive). Now: the "
            "same heads, parameters within 10%, a sweep, seeds, and the margin must beat the seed spread."},
    recall.SSM_INIT_CHANGE,  # shared with claim 8: the same trained SSM
]

GRADIENT_FAMILIES = {"transformer": {}, "lstm": dict(family="lstm"), "gru": dict(family="gru"), "rnn": dict(family="rnn"),
                     "ssm": dict(family="ssm", pos="none"), "linear": dict(family="linear", pos="none")}
# Quick scale trains one recurrence (lstm) and one fixed-state attention (linear) to keep the quick report inside
# its 5 minutes; the SSM (~0.1 s a training step here with the compiled scan, 0.34 s without) and gru/rnn are
# trained at full scale.
RECALL_FAMILIES = {"quick": ("transformer", "lstm", "linear"),
                   "full": ("transformer", "lstm", "gru", "rnn", "ssm", "linear")}
RECURRENT = ("rnn", "lstm", "gru")
EST_S = {"quick": 60, "full": 900}


def _grad_profile(kw, T, dists, device):
    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=64, n_layers=2, n_heads=4, max_seq_len=T, **kw), device)
    x = torch.randint(0, 256, (4, T)).to(device)  # drawn on the CPU: the same inputs on every device
    emb = model.tok_emb(x).detach().requires_grad_(True)
    hook = model.tok_emb.register_forward_hook(lambda m, i, o: emb)  # feed our leaf tensor as the embedding
    logits, _ = model(x)
    hook.remove()
    torch.nn.functional.cross_entropy(logits[:, -1], x[:, 0]).backward()
    norms = emb.grad.norm(dim=-1).mean(0)  # (T,)
    return [float(norms[T - 1 - d]) for d in dists]


def measure(scale: str, device: str) -> dict:
    T = 64 if scale == "quick" else 256
    dists = [d for d in (1, 2, 4, 8, 16, 32, 63, 128, 255) if d < T]
    grads = {name: _grad_profile(kw, T, dists, device) for name, kw in GRADIENT_FAMILIES.items()}
    recall.prefetch(RECALL_FAMILIES[scale], scale, device)  # all runs of the sweep share the cores
    return {"distances": dists, "grad_norms": grads, "recall_setup": recall.setup_dict(scale),
            "recall": {name: recall.summary(name, scale, device) for name in RECALL_FAMILIES[scale]}}


def decide(m: dict) -> Decision:
    g = m["grad_norms"]
    ratio = {f: v[-1] / v[0] if v[0] > 0 else 0.0 for f, v in g.items()}
    reasons = []
    grad_ok = ratio["transformer"] >= 0.1 and all(ratio[f] <= 0.01 for f in RECURRENT)
    reasons.append(f"gradient far/near: transformer {ratio['transformer']:.2g} (>= 0.1?), "
                   + ", ".join(f"{f} {ratio[f]:.2g}" for f in RECURRENT) + f" (each <= 0.01?): {'yes' if grad_ok else 'no'}")
    rec = {f: {**r, "test": recall.by_int(r["test"])} for f, r in m["recall"].items()}
    top = max(rec["transformer"]["test"])
    at = {f: [s["acc"] for s in r["test"][top] if s["acc"] is not None] for f, r in rec.items()}
    smallest = min(rec["transformer"]["test"])
    learned = max(max(s["acc"] for s in r["test"][smallest]) for r in rec.values())
    reasons.append(f"best accuracy at {smallest} pairs: {learned:.0%} (>= 50% means the task was learned)")
    wins = {f: compare(at["transformer"], at[f]) for f in at if f != "transformer"}
    tr = rec["transformer"]["test"][top]
    near, far = mean([s["near"] for s in tr]), mean([s["far"] for s in tr if s["far"] is not None] or [0.0])
    flat = far >= near - 0.05
    reasons.append(f"MQAR at {top} pairs: transformer {mean(at['transformer']):.0%} (spread "
                   f"{spread(at['transformer']):.0%}) vs " + ", ".join(f"{f} {mean(at[f]):.0%}" for f in wins)
                   + "; beaten beyond the spread: " + (", ".join(f for f, w in wins.items() if w) or "none"))
    reasons.append(f"transformer near/far half at {top} pairs: {near:.0%} / {far:.0%} (far within 5 points?): "
                   f"{'yes' if flat else 'no'}")
    if learned < 0.5:
        ok = None
        reasons.append("no family learned the task: inconclusive")
    elif not grad_ok or not flat or any(w is False for w in wins.values()):
        ok = False
    elif any(w is None for w in wins.values()):
        ok = None
        reasons.append("a recall difference is within the seed spread: inconclusive")
    else:
        ok = True
    figure = (f"gradient far/near: transformer {ratio['transformer']:.2g}, lstm {ratio['lstm']:.2g}; MQAR at {top} pairs: "
              + ", ".join(f"{f} {mean(a):.0%}" for f, a in at.items()))
    return Decision(verdict(ok), figure, reasons)


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
             "grad_far_over_near": m["grad_norms"][f][-1] / max(m["grad_norms"][f][0], 1e-30)} for f, r in rec.items()]
    s = recall.SETUPS[scale]
    return Outcome.of(d, m, [
        Plot("Gradient norm vs distance (at init)", "distance d", "|dL/dx_{T-1-d}|",
             [Series(f, dists, v) for f, v in m["grad_norms"].items()], log_x=True, log_y=True),
        Plot("MQAR accuracy vs key-value pairs (Zoology's curve)", "key-value pairs", "test accuracy",
             [Series(f, pairs, c) for f, c in curve.items()])], rows,
        [f"MQAR: sequences of {s.seq_len} tokens, vocabulary {s.vocab}, 0-{s.filler[1]} irrelevant tokens among the "
         f"pairs, trained on {s.train_pairs} pairs for {s.steps} steps of {s.batch}; learning rates {s.lrs} swept on "
         f"seed 0 (best on a validation draw), then {s.seeds} seed(s) at the best; every family within 10% of the "
         "transformer's parameters, the same 4 heads where a mixer has heads. Recurrent families train through "
         "torch's fused kernel (the same recurrence)."])

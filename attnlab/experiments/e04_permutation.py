"""Claim 4: without positional information attention is blind to order."""
import math

import torch

from attnlab.config import ModelConfig
from attnlab.experiments.base import Decision, Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "Order must be injected"
CLAIM = "Self-attention without positional encoding is permutation-equivariant: permuting the input permutes the output."
PREDICTION = ("With pos=none and no causal mask, outputs of a permuted input equal the permuted outputs to float "
              "precision; with sinusoidal, learned or rope encodings they differ by orders of magnitude more.")
THRESHOLD = "Supported if the max deviation is < 1e-4 with none and > 100x that with every encoding."
EST_S = {"quick": 1, "full": 1}  # seconds on a 2-core CPU: the report's progress estimate

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")
EQUAL, APART = 1e-4, 100  # the THRESHOLD above, as numbers


def measure(scale: str, device: str) -> dict:
    trials = 5 if scale == "quick" else 25
    dev = {}
    for pos in ENCODINGS:
        worst = 0.0
        for seed in range(trials):
            torch.manual_seed(seed)
            model = build_model(ModelConfig(dim=64, n_layers=2, n_heads=4, pos=pos, causal=False, init_std=0.3,
                                            max_seq_len=64), device).eval()
            x = torch.randint(0, 256, (1, 32)).to(device)
            perm = torch.randperm(32).to(device)
            with torch.no_grad():
                worst = max(worst, float((model(x[:, perm])[0] - model(x)[0][:, perm]).abs().max()))
        dev[pos] = worst
    return {"max_deviation": dev, "trials": trials}


def decide(measured: dict) -> Decision:
    dev = measured["max_deviation"]
    if not all(math.isfinite(v) for v in dev.values()):
        bad = [k for k, v in dev.items() if not math.isfinite(v)]
        return Decision(verdict(None), f"non-finite deviation for {', '.join(bad)}",
                        [f"deviation of {', '.join(bad)} is not finite: a numerical fault, not a measurement"])
    floor = max(dev["none"], 1e-7)  # float precision: a deviation of exactly 0 would make any gap infinite
    reasons = [f"none: max deviation {dev['none']:.1e} < {EQUAL:.0e}: {'yes' if dev['none'] < EQUAL else 'no'}"]
    reasons += [f"{p}: {dev[p]:.1e} > {APART}x none ({APART * floor:.1e}): {'yes' if dev[p] > APART * floor else 'no'}"
                for p in dev if p != "none"]
    ok = dev["none"] < EQUAL and all(dev[p] > APART * floor for p in dev if p != "none")
    figure = "max deviation: " + ", ".join(f"{p} {dev[p]:.1e}" for p in ("none", "rope", "sinusoidal") if p in dev)
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    dev = m["max_deviation"]
    names = list(dev)
    return Outcome.of(decide(m), m,
                      [Plot("Max |f(Px) - P f(x)| by encoding", "encoding (index)", "max deviation",
                            [Series("deviation", list(range(len(names))), [max(dev[n], 1e-9) for n in names])],
                            log_y=True)],
                      [{"encoding": n, "max_deviation": dev[n]} for n in names],
                      ["x axis: " + ", ".join(f"{i}={n}" for i, n in enumerate(names)),
                       "ALiBi's bias depends on relative distance, so it breaks equivariance too."])

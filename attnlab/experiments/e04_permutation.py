"""Claim 4: without positional information attention is blind to order."""
import torch

from attnlab.config import ModelConfig
from attnlab.experiments.base import Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "Order must be injected"
CLAIM = "Self-attention without positional encoding is permutation-equivariant: permuting the input permutes the output."
PREDICTION = ("With pos=none and no causal mask, outputs of a permuted input equal the permuted outputs to float "
              "precision; with sinusoidal, learned or rope encodings they differ by orders of magnitude more.")
THRESHOLD = "Supported if the max deviation is < 1e-4 with none and > 100x that with every encoding."


def run(scale: str, device: str) -> Outcome:
    trials = 5 if scale == "quick" else 25
    dev = {}
    for pos in ("none", "sinusoidal", "learned", "rope", "alibi"):
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
    ok = dev["none"] < 1e-4 and all(dev[p] > 100 * max(dev["none"], 1e-7) for p in dev if p != "none")
    names = list(dev)
    return Outcome(verdict(ok), f"max deviation: none {dev['none']:.1e}, rope {dev['rope']:.1e}, sinusoidal "
                   f"{dev['sinusoidal']:.1e}", {"max_deviation": dev, "trials": trials},
                   [Plot("Max |f(Px) - P f(x)| by encoding", "encoding (index)", "max deviation",
                         [Series("deviation", list(range(len(names))), [max(dev[n], 1e-9) for n in names])],
                         log_y=True)],
                   [{"encoding": n, "max_deviation": dev[n]} for n in names],
                   ["x axis: " + ", ".join(f"{i}={n}" for i, n in enumerate(names)),
                    "ALiBi's bias depends on relative distance, so it breaks equivariance too."])

"""Claim 5: which positional encodings keep working past the training length."""
import copy
import math

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tasks import make_task
from attnlab.experiments.base import Outcome, Plot, Series, verdict
from attnlab.models import build_model
from attnlab.models.positional import Rope
from attnlab.train import evaluate, train_in_memory

TITLE = "Extrapolation beyond the training length"
CLAIM = "Rotary position embeddings extrapolate to longer sequences better than absolute sinusoidal ones (a contested claim)."
PREDICTION = ("Trained at length L on the embedded corpus and evaluated at L, 2L, 4L, 8L: ALiBi degrades least; "
              "rope degrades less than sinusoidal; learned cannot run past L; rope with position interpolation or "
              "NTK scaling at inference recovers part of the loss.")
THRESHOLD = "The claim is supported if rope's perplexity ratio (4L vs L) is lower than sinusoidal's; not supported otherwise."

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")

# Changes to how this claim is measured, dated; CLAIM, PREDICTION and THRESHOLD above are unchanged by them.
CHANGES = [
    {"date": "2026-11-30",
     "what": "The sinusoidal baseline scales the token embedding by sqrt(dim) before adding the encodings "
             "(Vaswani et al. 2017, sec. 3.4), as the original paper does; models/positional.py: Sinusoidal.",
     "why": "Unscaled, unit-amplitude encodings on embeddings initialised at std 0.02 drowned the tokens, so the "
            "baseline trained worse than no positions at all: a broken baseline, not the method the claim names."},
]


def _train(pos, task, cfg_t, L, device):
    torch.manual_seed(0)
    return train_in_memory(build_model(ModelConfig(dim=96, n_layers=3, n_heads=4, pos=pos, max_seq_len=L), device),
                           lambda step: tuple(t.to(device) for t in task.batch(step)), cfg_t)


def _scaled(model, kind, factor, device):
    m = copy.deepcopy(model)
    m.cfg = copy.copy(m.cfg)
    m.pos_enc = Rope(m.cfg.head_dim, m.cfg.rope_theta, {"type": kind, "factor": factor}).to(device)
    return m


def run(scale: str, device: str) -> Outcome:
    L, steps = (64, 250) if scale == "quick" else (128, 1500)
    cfg_t = TrainConfig(seq_len=L, batch_size=16, steps=steps, warmup_steps=steps // 10, lr=3e-3, eval_batches=4,
                        corpus_max_bytes=3_000_000)
    task = make_task(cfg_t)
    mults = [1, 2, 4, 8]
    evals = {m: task.eval_batches(L * m) for m in mults}
    ppl = {}
    models = {pos: _train(pos, task, cfg_t, L, device) for pos in ENCODINGS}
    for pos, model in models.items():
        ppl[pos] = [math.exp(evaluate(model, evals[m], device)["val_loss"]) if (pos != "learned" or m == 1) else None
                    for m in mults]
    for kind in ("linear", "ntk"):
        ppl[f"rope+{kind}"] = [math.exp(evaluate(_scaled(models["rope"], kind, m, device) if m > 1 else models["rope"],
                                                 evals[m], device)["val_loss"]) for m in mults]
    ratio = {k: v[2] / v[0] for k, v in ppl.items() if v[2] is not None}
    ok = ratio["rope"] < ratio["sinusoidal"]
    rows = [{"encoding": k, **{f"ppl_{m}L": v[i] for i, m in enumerate(mults)}} for k, v in ppl.items()]
    return Outcome(verdict(ok), f"perplexity at 4L / at L: rope {ratio['rope']:.2f}, sinusoidal {ratio['sinusoidal']:.2f}, "
                   f"alibi {ratio['alibi']:.2f}, rope+ntk {ratio['rope+ntk']:.2f}", {"train_len": L, "ppl": ppl, "ratio_4L": ratio},
                   [Plot("Held-out perplexity vs evaluation length", "evaluation length / training length", "perplexity (per byte)",
                         [Series(k, [m for m, p in zip(mults, v) if p is not None], [p for p in v if p is not None])
                          for k, v in ppl.items()], log_x=True, log_y=True)], rows,
                   [f"Byte-level models of ~0.35M parameters trained {steps} steps at L={L}; small models and short "
                    "training make the absolute numbers rough. 'learned' has no positions past L."])

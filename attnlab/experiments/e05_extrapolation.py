"""Claim 5: which positional encodings keep working past the training length."""
import copy
import dataclasses
import math

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tasks import make_task
from attnlab.experiments.base import Decision, Outcome, Plot, Series, compare, mean, spread, verdict
from attnlab.experiments.workers import map_runs, workers_for
from attnlab.models import build_model
from attnlab.models.positional import Rope
from attnlab.train import evaluate, train_in_memory

TITLE = "Extrapolation beyond the training length"
CLAIM = "Rotary position embeddings extrapolate to longer sequences better than absolute sinusoidal ones (a contested claim)."
PREDICTION = ("Trained at length L on the embedded corpus and evaluated at L, 2L, 4L, 8L: ALiBi degrades least; "
              "rope degrades less than sinusoidal; learned cannot run past L; rope with position interpolation or "
              "NTK scaling at inference recovers part of the loss.")
THRESHOLD = ("Supported if rope's perplexity ratio (4L vs L), averaged over seeds, is lower than sinusoidal's by more "
             "than the spread over seeds; not supported if higher by more than that spread; inconclusive within it.")

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi")

# Changes to how this claim is measured or decided, dated.
CHANGES = [
    {"date": "2026-11-30",
     "what": "The sinusoidal baseline scales the token embedding by sqrt(dim) before adding the encodings "
             "(Vaswani et al. 2017, sec. 3.4), as the original paper does; models/positional.py: Sinusoidal.",
     "why": "Unscaled, unit-amplitude encodings on embeddings initialised at std 0.02 drowned the tokens, so the "
            "baseline trained worse than no positions at all: a broken baseline, not the method the claim names."},
    {"date": "2026-11-30", "what": "threshold and method: seeds, and a margin that must beat their spread",
     "old": "The claim is supported if rope's perplexity ratio (4L vs L) is lower than sinusoidal's; not supported otherwise.",
     "new": THRESHOLD,
     "why": ("One seed cannot tell a difference between encodings from the luck of one initialisation and data order. "
             "rope and sinusoidal now train on 3 seeds at full scale (1 at quick, to keep it fast; its reasons say the "
             "spread is unmeasured) and the verdict needs the gap to exceed the seed spread.")},
    {"date": "2026-11-30", "what": "method: quick scale trains sinusoidal, rope and alibi only (full scale: all five)",
     "why": ("'none' and 'learned' are context the verdict does not use; dropping them at quick scale pays for the "
             "warm-ups, repeats and fresh-process memory measurements the other claims now make, keeping the quick "
             "report inside its 5 minutes.")},
]
EST_S = {"quick": 30, "full": 1200}  # seconds on a 2-core CPU: the report's progress estimate
SEEDS = {"quick": (0,), "full": (0, 1, 2)}
COMPARED = ("rope", "sinusoidal")  # trained on every seed; the other encodings on the first seed only (context)
TRAINED = {"quick": ("sinusoidal", "rope", "alibi"), "full": ENCODINGS}  # on the first seed


def _model_cfg(pos: str, L: int) -> ModelConfig:
    return ModelConfig(dim=96, n_layers=3, n_heads=4, pos=pos, max_seq_len=L)


def _train(pos, task, cfg_t, L, device, seed):
    torch.manual_seed(seed)  # the seed sets the initialisation; the task's seed sets the data order
    return train_in_memory(build_model(_model_cfg(pos, L), device),
                           lambda step: tuple(t.to(device) for t in task.batch(step)), cfg_t)


def _train_job(pos: str, cfg_t: TrainConfig, L: int, seed: int, device: str) -> dict:
    """One run, as a worker process runs it (workers.py; CPU only): the weights as plain tensors."""
    model = _train(pos, make_task(cfg_t), cfg_t, L, device, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _trained(jobs: list, cfg_of, L: int, device: str) -> list:
    """Models for [(pos, seed)], side by side in worker processes on the CPU, else one after another here."""
    workers = workers_for(device)
    if workers <= 1:
        return [_train(pos, make_task(cfg_of(seed)), cfg_of(seed), L, device, seed) for pos, seed in jobs]
    models = []
    runs = [(pos, cfg_of(seed), L, seed, str(device)) for pos, seed in jobs]
    for (pos, _), weights in zip(jobs, map_runs(_train_job, runs, workers)):
        model = build_model(_model_cfg(pos, L), device)
        model.load_state_dict(weights)
        models.append(model.eval())
    return models


def _scaled(model, kind, factor, device):
    m = copy.deepcopy(model)
    m.cfg = copy.copy(m.cfg)
    m.pos_enc = Rope(m.cfg.head_dim, m.cfg.rope_theta, {"type": kind, "factor": factor}).to(device)
    return m


MULTS = [1, 2, 4, 8]


def measure(scale: str, device: str) -> dict:
    L, steps = (64, 250) if scale == "quick" else (128, 1500)
    cfg_t = TrainConfig(seq_len=L, batch_size=16, steps=steps, warmup_steps=steps // 10, lr=3e-3, eval_batches=4,
                        corpus_max_bytes=3_000_000)
    task = make_task(cfg_t)
    evals = {m: task.eval_batches(L * m) for m in MULTS}  # the same held-out windows for every seed
    ppl_of = lambda model, m: math.exp(evaluate(model, evals[m], device)["val_loss"])
    seeds = SEEDS[scale]
    cfg_of = lambda seed: cfg_t if seed == seeds[0] else dataclasses.replace(cfg_t, seed=seed)
    jobs = [(pos, seed) for seed in seeds for pos in (TRAINED[scale] if seed == seeds[0] else COMPARED)]
    ppl, by_seed = {}, {pos: [] for pos in COMPARED}
    for (pos, seed), model in zip(jobs, _trained(jobs, cfg_of, L, device)):
        p = [ppl_of(model, m) if (pos != "learned" or m == 1) else None for m in MULTS]
        if pos in COMPARED:
            by_seed[pos].append(p[2] / p[0])
        if seed != seeds[0]:
            continue
        ppl[pos] = p
        if pos == "rope":
            for kind in ("linear", "ntk"):
                ppl[f"rope+{kind}"] = [ppl_of(_scaled(model, kind, m, device) if m > 1 else model, m) for m in MULTS]
    ratio = {k: v[2] / v[0] for k, v in ppl.items() if v[2] is not None}
    return {"train_len": L, "steps": steps, "seeds": list(seeds), "ppl": ppl, "ratio_4L": ratio,
            "ratio_4L_by_seed": by_seed}


def decide(measured: dict) -> Decision:
    r = measured["ratio_4L_by_seed"]
    rope, sin = r["rope"], r["sinusoidal"]
    if not rope or not sin or not all(math.isfinite(x) for x in rope + sin):
        return Decision(verdict(None), "no finite perplexity ratios", ["a perplexity ratio is missing or not finite"])
    diff, noise = mean(sin) - mean(rope), max(spread(rope), spread(sin))
    better = compare(sin, rope)  # True: sinusoidal's ratio is higher (rope degrades less) beyond the spread
    reasons = [f"perplexity 4L/L over {len(rope)} seed(s): rope {mean(rope):.2f} (" + ", ".join(f"{x:.2f}" for x in rope)
               + f"), sinusoidal {mean(sin):.2f} (" + ", ".join(f"{x:.2f}" for x in sin) + ")",
               f"rope lower by {diff:.2f} beyond the seed spread {noise:.2f}: "
               + {True: "yes", False: "no: higher beyond it", None: "within the spread"}[better]]
    if len(rope) < 2 or len(sin) < 2:
        reasons.append("one seed: the seed spread is not measured (quick scale); full scale runs 3")
    a = measured.get("ratio_4L", {})
    figure = (f"perplexity at 4L / at L: rope {mean(rope):.2f}, sinusoidal {mean(sin):.2f} (mean of {len(rope)} seed(s), "
              f"spread {noise:.2f})" + "".join(f", {k} {a[k]:.2f}" for k in ("alibi", "rope+ntk") if k in a))
    return Decision(verdict(better), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    ppl = m["ppl"]
    rows = [{"encoding": k, **{f"ppl_{mu}L": v[i] for i, mu in enumerate(MULTS)}} for k, v in ppl.items()]
    rows += [{"encoding": f"{k} (seed {s})", "ratio_4L": x} for k, xs in m["ratio_4L_by_seed"].items()
             for s, x in zip(m["seeds"], xs)]
    return Outcome.of(decide(m), m,
                      [Plot("Held-out perplexity vs evaluation length (first seed)", "evaluation length / training length",
                            "perplexity (per byte)", [Series(k, [mu for mu, p in zip(MULTS, v) if p is not None],
                                                             [p for p in v if p is not None]) for k, v in ppl.items()],
                            log_x=True, log_y=True)], rows,
                      [f"Byte-level models of ~0.35M parameters trained {m['steps']} steps at L={m['train_len']}; small "
                       "models and short training make the absolute numbers rough. 'learned' has no positions past L.",
                       f"rope and sinusoidal ran on seeds {m['seeds']}; the other encodings and the rope scalings on the "
                       "first seed only (context, not in the verdict)."])

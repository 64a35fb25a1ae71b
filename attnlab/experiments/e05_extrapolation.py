"""Claim 5: which positional encodings keep working past the training length.

Each seed is decided alone and the seeds must agree (3 at full scale). The regime is measured: the evaluation
windows' length over the training batches' length (>= 4), and each compared model having learned the text at its
training length (perplexity below the held-out bytes' unigram perplexity, i.e. more than letter frequencies).
"""
import copy
import math

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tasks import make_task
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, in_regime, mean, over_repeats, spread,
                                      verdict)
from attnlab.experiments.training import FILLER, Job, run_tasks, workers_for
from attnlab.models import build_model
from attnlab.models.positional import Rope
from attnlab.fit import evaluate, train_in_memory

TITLE = "Extrapolation beyond the training length"
CLAIM = "Rotary position embeddings extrapolate to longer sequences better than absolute sinusoidal ones (a contested claim)."
PREDICTION = ("Trained at length L on the embedded corpus and evaluated at L, 2L, 4L, 8L: ALiBi degrades least; "
              "rope degrades less than sinusoidal; learned cannot run past L; rope with position interpolation or "
              "NTK scaling at inference recovers part of the loss.")
THRESHOLD_RATIO = ("Decided per seed (3 at full scale), the seeds required to agree: supported if rope's perplexity ratio "
                   "(4L vs L) is below 0.9x sinusoidal's; not supported if above 1.1x; inconclusive between, or if the "
                   "seeds disagree.")
THRESHOLD = (THRESHOLD_RATIO[:-1] + ". Each clause of the prediction that can be measured is decided the same way "
             "per seed, on the perplexity ratio (4L vs L): ALiBi's below 0.9x the lower of rope's and sinusoidal's "
             "(above 1.1x: refuted); the better of rope + position interpolation and rope + NTK scaling below 0.9x "
             "plain rope's (above 1.1x: refuted). A seed is supported when every clause is, not supported when any "
             "is refuted, inconclusive otherwise. ('learned cannot run past L' is a property of the model, not "
             "measured.)")
# The regime as it read before ALiBi joined the compared encodings (CHANGES quotes it).
_REGIME_RATIO = ("Extrapolation needs test lengths >= 4x the trained length (measured on the evaluation and training "
                 "batches), and models that learned the text at L: rope's and sinusoidal's perplexity at L below the "
                 "held-out bytes' unigram perplexity.")
REGIME = ("Extrapolation needs test lengths >= 4x the trained length (measured on the evaluation and training batches), "
          "and models that learned the text at L: rope's, sinusoidal's and ALiBi's perplexity at L below the held-out "
          "bytes' unigram perplexity.")

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
     "new": "Supported if rope's perplexity ratio (4L vs L), averaged over seeds, is lower than sinusoidal's by more than the spread over seeds; not supported if higher by more than that spread; inconclusive within it.",
     "why": ("One seed cannot tell a difference between encodings from the luck of one initialisation and data order. "
             "rope and sinusoidal now train on 3 seeds at full scale (1 at quick, to keep it fast; its reasons say the "
             "spread is unmeasured) and the verdict needs the gap to exceed the seed spread.")},
    {"date": "2026-11-30", "what": "method: quick scale trains sinusoidal, rope and alibi only (full scale: all five)",
     "why": ("'none' and 'learned' are context the verdict does not use; dropping them at quick scale pays for the "
             "warm-ups, repeats and fresh-process memory measurements the other claims now make, keeping the quick "
             "report inside its 5 minutes.")},
    {"date": "2026-12-02", "what": "threshold: per-seed verdicts with a 10% margin; a measured regime",
     "old": ("Supported if rope's perplexity ratio (4L vs L), averaged over seeds, is lower than sinusoidal's by more "
             "than the spread over seeds; not supported if higher by more than that spread; inconclusive within it."),
     "new": THRESHOLD_RATIO + " Regime: " + _REGIME_RATIO,
     "why": ("Issue 29: every verdict from >= 3 independent repetitions, each decided alone (a mean can hide a seed "
             "that goes the other way), and the test length measured rather than assumed. Verdict before: supported "
             "(full: rope 3.01 / 2.26 / 2.96 vs sinusoidal 5.89 / 6.01 / 6.56, each seed below 0.9x); after: "
             "supported at quick scale, full scale not rerun in this change.")},
    {"date": "2026-12-03", "what": "threshold: every clause of the prediction decided; method: 700 training steps",
     "old": (THRESHOLD_RATIO + " Regime: " + _REGIME_RATIO + " Training: 1,500 steps; ALiBi and the rope scalings on "
             "the first seed only."),
     "new": THRESHOLD + " Regime: " + REGIME + " Training: 700 steps; ALiBi and rope's scalings at 4L on every seed.",
     "why": ("Issue 29: the prediction names ALiBi and the inference-time rope scalings, which the verdict left out. "
             "700 steps: the full report must fit in an hour on 2 cores, and at 1,500 the models were far inside the "
             "regime (perplexity at L 4.0-5.1 against a unigram 23.3) and the margin (rope 2.26-3.01 vs sinusoidal "
             "5.89-6.56). Verdict before, on the first seed's context: ALiBi 0.96, rope + NTK 1.62, rope + PI 5.11 "
             "vs rope 3.01: each clause holds on that seed, so supported under both wordings. Verdict after: the "
             "next full run.")},
]
EST_S = {"quick": 5, "full": 60}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 15, "full": 350}  # this claim's share of the training stage (training.py), in seconds
SEEDS = {"quick": (0,), "full": (0, 1, 2)}
MARGIN = 0.1  # a perplexity ratio below (1 - MARGIN) x the one it is compared with, or above (1 + MARGIN) x, counts
MIN_MULT = 4  # the REGIME: test lengths at least this many times the trained length
COMPARED = ("rope", "sinusoidal", "alibi")  # trained on every seed; the others on the first seed only (context)
SCALED = ("rope+linear", "rope+ntk")  # rope's models scaled at inference (position interpolation, NTK), every seed
TRAINED = {"quick": ("sinusoidal", "rope", "alibi"), "full": ENCODINGS}  # on the first seed


def _model_cfg(pos: str, L: int) -> ModelConfig:
    return ModelConfig(dim=96, n_layers=3, n_heads=4, pos=pos, max_seq_len=L)


def _train(pos, task, cfg_t, L, device, seed):
    torch.manual_seed(seed)  # the seed sets the initialisation; the task's seed sets the data order
    return train_in_memory(build_model(_model_cfg(pos, L), device),
                           lambda step: tuple(t.to(device) for t in task.batch(step)), cfg_t)


def _train_job(pos: str, cfg_t: TrainConfig, L: int, seed: int, device: str) -> dict:
    """One run, as the training stage runs it (training.py): the weights as plain tensors."""
    model = _train(pos, make_task(cfg_t), cfg_t, L, device, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train_cfg(scale: str, seed: int) -> TrainConfig:
    L, steps = (64, 250) if scale == "quick" else (128, 700)
    return TrainConfig(seq_len=L, batch_size=16, steps=steps, warmup_steps=steps // 10, lr=3e-3, eval_batches=4,
                       corpus_max_bytes=3_000_000, seed=seed)


def _runs(scale: str) -> list[tuple[str, int]]:
    """[(encoding, seed)]: every encoding on the first seed, the compared ones on the others."""
    seeds = SEEDS[scale]
    return [(pos, seed) for seed in seeds for pos in (TRAINED[scale] if seed == seeds[0] else COMPARED)]


_CACHE: dict = {}  # (scale, device) -> [((encoding, seed), model)], filled by _models


def _models(scale: str, device: str):
    """The training-stage task (training.py) that trains every run of ``_runs``."""
    cfg = lambda seed: _train_cfg(scale, seed)
    runs = _runs(scale)
    weights = yield [Job(_train_job, (pos, cfg(seed), cfg(seed).seq_len, seed, str(device)), FILLER)
                     for pos, seed in runs]
    models = []
    for (pos, seed), w in zip(runs, weights):
        model = build_model(_model_cfg(pos, cfg(seed).seq_len), device)
        model.load_state_dict(w)
        models.append(((pos, seed), model.eval()))
    _CACHE[(scale, str(device))] = models


def training(scale: str, device: str) -> dict:
    """This claim's models, for the report's training stage (training.py)."""
    key = (scale, str(device))
    return {} if key in _CACHE else {("extrapolation",) + key: _models(scale, device)}


def _scaled(model, kind, factor, device):
    m = copy.deepcopy(model)
    m.cfg = copy.copy(m.cfg)
    m.pos_enc = Rope(m.cfg.head_dim, m.cfg.rope_theta, {"type": kind, "factor": factor}).to(device)
    return m


MULTS = [1, 2, 4, 8]


def measure(scale: str, device: str) -> dict:
    seeds = SEEDS[scale]
    cfg_t = _train_cfg(scale, seeds[0])
    L, steps = cfg_t.seq_len, cfg_t.steps
    task = make_task(cfg_t)
    evals = {m: task.eval_batches(L * m) for m in MULTS}  # the same held-out windows for every seed
    ppl_of = lambda model, m: math.exp(evaluate(model, evals[m], device)["val_loss"])
    run_tasks(training(scale, device).values(), workers_for(device))  # done by the training stage, unless run alone
    ppl, by_seed, at_L = {}, {pos: [] for pos in COMPARED + SCALED}, {pos: [] for pos in COMPARED}
    for (pos, seed), model in _CACHE[(scale, str(device))]:
        p = [ppl_of(model, m) if (pos != "learned" or m == 1) else None for m in MULTS]
        if pos in COMPARED:
            by_seed[pos].append(p[2] / p[0])
            at_L[pos].append(p[0])
        if pos == "rope":  # scaled at inference: every length on the first seed (the plot), 4L on the others
            for kind in ("linear", "ntk"):
                mults = MULTS if seed == seeds[0] else [MULTS[2]]
                q = {m: ppl_of(_scaled(model, kind, m, device), m) for m in mults if m > 1}
                by_seed[f"rope+{kind}"].append(q[MULTS[2]] / p[0])
                if seed == seeds[0]:
                    ppl[f"rope+{kind}"] = [q.get(m, p[0]) for m in MULTS]
        if seed == seeds[0]:
            ppl[pos] = p
    ratio = {k: v[2] / v[0] for k, v in ppl.items() if v[2] is not None}
    targets = torch.cat([y.reshape(-1) for _, y in evals[1]])
    freq = torch.bincount(targets).double() / targets.numel()
    unigram = math.exp(-float((freq[freq > 0] * freq[freq > 0].log()).sum()))
    return {"train_len": L, "steps": steps, "seeds": list(seeds), "ppl": ppl, "ratio_4L": ratio,
            "ratio_4L_by_seed": by_seed, "ppl_L_by_seed": at_L, "unigram_ppl": unigram,
            "trained_len_measured": int(task.batch(0)[0].shape[1]),
            "test_len_measured": int(evals[MULTS[2]][0][0].shape[1])}


def regime(measured: dict, i: int) -> list[dict]:
    mult = measured["test_len_measured"] / measured["trained_len_measured"]
    out = [condition("test length / trained length", mult, f">= {MIN_MULT}", mult >= MIN_MULT,
                     f"{measured['test_len_measured']} / {measured['trained_len_measured']} = {mult:.1f}x")]
    uni = measured["unigram_ppl"]
    for pos in COMPARED:
        if pos in measured["ppl_L_by_seed"]:  # runs before ALiBi trained on every seed lack it
            p = measured["ppl_L_by_seed"][pos][i]
            out.append(condition(f"{pos} perplexity at L", p, f"< {uni:.1f} (unigram)", p < uni, f"{p:.2f}"))
    return out


def _below(x: float, ref: float) -> bool | None:
    """x below (1 - MARGIN) ref: True; above (1 + MARGIN) ref: False; within the margin: None."""
    return True if x < (1 - MARGIN) * ref else (False if x > (1 + MARGIN) * ref else None)


_WORD = {True: f"yes (below {1 - MARGIN:.1f}x)", False: f"no: above {1 + MARGIN:.1f}x", None: f"within {MARGIN:.0%}"}


def clauses(measured: dict, i: int) -> list[tuple[str, bool | None]]:
    """Each clause of the PREDICTION on seed i: (reason, outcome: True / False / None within the margin or missing)."""
    r = measured["ratio_4L_by_seed"]
    at = lambda k: r[k][i] if len(r.get(k, ())) > i and not math.isnan(r[k][i]) else None  # inf: it blew up
    rope, sin, alibi = at("rope"), at("sinusoidal"), at("alibi")
    said = lambda text, ok: (text + _WORD[ok], ok)
    out = [said(f"perplexity 4L/L rope {rope:.2f} vs sinusoidal {sin:.2f}: rope lower? ", _below(rope, sin))]
    if alibi is None:
        out.append(("ALiBi not measured on this seed", None))
    else:
        out.append(said(f"ALiBi {alibi:.2f} vs the better of rope and sinusoidal {min(rope, sin):.2f}: ALiBi lower? ",
                        _below(alibi, min(rope, sin))))
    scaled = {k: at(k) for k in SCALED if at(k) is not None}
    if not scaled:
        out.append(("rope scaled at inference not measured on this seed", None))
    else:
        best = min(scaled, key=scaled.get)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in scaled.items())
        out.append(said(f"rope scaled at inference ({shown}) vs plain rope {rope:.2f}: {best} recovers part? ",
                        _below(scaled[best], rope)))
    return out


def decide_one(measured: dict, i: int) -> Decision:
    r = measured["ratio_4L_by_seed"]
    rope, sin = r["rope"][i], r["sinusoidal"][i]
    seed = measured.get("seeds", list(range(i + 1)))[i]
    if not all(math.isfinite(x) for x in (rope, sin)):
        return Decision(verdict(None), "no finite perplexity ratios", [f"seed {seed}: a perplexity ratio is not finite"])
    parts = clauses(measured, i)
    outcomes = [ok for _, ok in parts]
    ok = False if False in outcomes else (True if all(outcomes) else None)
    return Decision(verdict(ok), f"seed {seed}: rope {rope:.2f}, sinusoidal {sin:.2f}",
                    [f"seed {seed}: " + "; ".join(text for text, _ in parts)])


def decide(measured: dict) -> Decision:
    r = measured["ratio_4L_by_seed"]
    n = min(len(r["rope"]), len(r["sinusoidal"]))
    if not n:
        return Decision(verdict(None), "no perplexity ratios", ["a perplexity ratio is missing"])
    d = over_repeats([in_regime(regime(measured, i), decide_one(measured, i)) for i in range(n)])
    rope, sin = r["rope"][:n], r["sinusoidal"][:n]
    a = measured.get("ratio_4L", {})
    d.figure = (f"perplexity at 4L / at L: rope {mean(rope):.2f}, sinusoidal {mean(sin):.2f} (mean of {n} seed(s), "
                f"spread {max(spread(rope), spread(sin)):.2f})" + "".join(
                    f", {k} {mean(r[k][:n]) if k in r else a[k]:.2f}" for k in ("alibi", "rope+ntk") if k in r or k in a))
    if n < 2:
        d.reasons.append("one seed (quick scale); full scale runs 3")
    return d


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
                       f"{', '.join(COMPARED)} (and rope's scalings at 4L) ran on seeds {m['seeds']}; 'none' and "
                       "'learned' on the first seed only (context, not in the verdict)."])

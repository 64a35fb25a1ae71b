"""Claim 18: self-attention beats Markov chains and RNNs at next-item prediction, more so for long histories."""
from __future__ import annotations

import math

from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, Series, condition, in_regime, mean,
                                      over_repeats, spread, verdict)

TITLE = "Self-attention for sequential recommendation"
CLAIM = ("Self-attention (SASRec) predicts a user's next item better than Markov chains and RNNs (GRU4Rec), and the "
         "gap grows with the length of the history: attention reads the whole history at once and catches "
         "long-range dependencies that sequential models miss.")
PREDICTION = ("On MovieLens-100K when it is cached locally (else on the synthetic histories with long-range tastes), "
              "leave-one-out, full ranking over all items: sasrec's test NDCG@10 exceeds markov's and gru4rec's; and "
              "sasrec's lead over the better of the two is larger for the users with the longest histories than for "
              "those with the shortest (history-length buckets of at least 30 users).")
MIN_MARGIN = 0.003  # NDCG@10: a difference smaller than this never counts, however many users
MIN_USERS = 30  # a history-length bucket needs this many test users to enter the comparison
Z = 2.0  # a paired difference counts beyond Z standard errors over the test users (about 95%)
LEARNED = 2.0  # a neural model has learned when its NDCG@10 is at least this many times popularity's
PLATEAU = 5  # epochs without a better validation score before training ended: it had stopped learning
THRESHOLD = (f"Each seed is decided alone. A difference counts only beyond {Z:g} standard errors of the paired "
             f"per-user difference (the same test users under both models) and beyond {MIN_MARGIN} NDCG@10. A seed "
             "is supported if sasrec beats both markov and gru4rec overall and its lead over the better of the two "
             "in the longest bucket exceeds its lead in the shortest; not supported if either baseline beats sasrec "
             "overall, or the lead is smaller in the longest bucket than in the shortest; otherwise inconclusive. The "
             "verdict is the seeds' common verdict (3 seeds at full scale); seeds that disagree make it inconclusive "
             "(unstable).")
REGIME = (f"Models that learned the task, on named data: MovieLens-100K when cached, else the synthetic histories "
          f"with long-range tastes (the data's name is shown); sasrec's and gru4rec's full-ranking NDCG@10 each at "
          f">= {LEARNED:g}x popularity's on the same test users, each trained until its validation score had "
          f"stopped improving (its best epoch >= {PLATEAU} epochs before training ended, not cut off by the time cap "
          f"while still learning); at least two history-length buckets of >= {MIN_USERS} test users.")
REGIME_OLD = (f"Models that learned the task, on named data: MovieLens-100K when cached, else the synthetic histories "
              f"with long-range tastes (the data's name is shown); sasrec's and gru4rec's full-ranking NDCG@10 each at "
              f">= {LEARNED:g}x popularity's on the same test users; at least two history-length buckets of >= "
              f"{MIN_USERS} test users.")
CHANGES = [
    {"date": "2026-11-30", "what": "method: the quick scale's size (prediction and threshold unchanged)",
     "old": "quick: 600 synthetic users, 2 seeds, 6 s of training per neural run (measured: 65 s, not supported)",
     "new": "quick: 400 synthetic users, 1 seed, 5 s of training per neural run (measured: 14 s, not supported)",
     "why": "The quick scale must stay near 30 s on 2 cores; the first setting took 65 s."},
    {"date": "2026-11-30", "what": "method: the neural models' training (FitConfig; prediction and threshold unchanged)",
     "old": "cross-entropy logits at every window position (padding ignored in the loss); early stopping patience 10",
     "new": "logits only at real positions (the same loss value, about 20% cheaper steps on ML-100K, so the 5 s and "
            "60 s training caps fit more epochs); patience 20. Learning rate (constant 1e-3), AdamW betas and dropout "
            "are unchanged",
     "why": "Issue 14 (SASRec at RecBole's NDCG@10 within 120 s): cheaper epochs, and patience 10 stopped runs on a "
            "noisy validation spike before their best (tuning seeds 10, 11, validation NDCG@10 only)."},
    {"date": "2026-12-01", "what": "method: the neural models' training (FitConfig; prediction and threshold unchanged)",
     "old": "the same window cuts every epoch; the last step's weights evaluated and kept; constant learning rate 1e-3",
     "new": "new window cuts each epoch (every target still scored once, with up to max_len items before it); an "
            "average of the weights (decay 0.99 per step) evaluated and kept; constant learning rate 2e-3. The same "
            "loop for SASRec and GRU4Rec",
     "why": "Issue 14 (SASRec at RecBole's NDCG@10 within 120 s on every seed): on tuning seeds 10, 11 (ML-100K "
            "validation NDCG@10 only, 120 s each) the best epoch went from 0.0731 to 0.0806 (train.py keeps the "
            "table). The fixed cuts showed the first target of each window one item of history, every epoch."},
    {"date": "2026-12-01", "what": "method: the neural models' training (FitConfig, models/dropout.py; prediction and "
                                   "threshold unchanged)",
     "old": "cross-entropy against the one-hot target; torch's dropout (one random number per element)",
     "new": "label smoothing 0.1; dropout masks drawn four elements per 64-bit random word (the same rate and "
            "scaling, the step about a quarter cheaper, so a training cap fits more epochs). Both models",
     "why": "Issue 14 (SASRec at RecBole's NDCG@10 within 120 s on every seed): on tuning seeds 10, 11 (ML-100K "
            "validation NDCG@10 only, 120 s each, 4 runs per setting) smoothing took the best epoch from 0.0771 to "
            "0.0785 and the last 3 epochs from 0.0741 to 0.0770; torch's dropout mask was 17% of a SASRec step."},
    {"date": "2026-12-02", "what": "threshold and method: margins from the test users, seeds decided alone, a regime",
     "old": "margins: the seed spread (max - min over 2 seeds) or 0.003, on the seeds' mean; 2 seeds at full scale, "
            "60 s of training per neural run; too few buckets made the verdict inconclusive",
     "new": f"each seed decided alone (3 at full scale, 40 s of training per neural run) with margins of {Z:g} standard "
            "errors of the paired per-user NDCG@10 difference (or 0.003); seeds that disagree: inconclusive "
            f"(unstable); REGIME: the neural models at >= {LEARNED:g}x popularity's NDCG@10, two buckets of 30 users",
     "why": "Issue 29: a verdict from >= 3 repetitions with margins that reflect noise. Two seeds' spread says nothing "
            "about the test users' sampling noise (about 0.01 NDCG@10 for a paired difference over 1,000-1,500 "
            "users), which decides whether a 0.009 gap is a finding. Verdict before: inconclusive on the synthetic "
            "histories (reports/cpu-full), not supported on MovieLens-100K (reports/cpu-full-claim18-ml100k); "
            "after, at quick scale: inconclusive (regime not reached: sasrec and gru4rec at 0.95x and 0.97x "
            "popularity's NDCG@10 after 5 s of training; the same data read 'not supported' before)."},
    {"date": "2026-12-03", "what": "method: 3,000 synthetic users at full scale instead of 1,500 (prediction, "
                                   "threshold and training caps unchanged)",
     "old": "1,500 synthetic users (the same generator otherwise)",
     "new": "3,000 synthetic users: the paired differences' standard errors about 1/sqrt(2) of before",
     "why": "Issue 29 (verdicts that hold across runs): the reference run at 2ef4f65 read not supported, inconclusive, "
            "inconclusive over its 3 seeds: gru4rec led sasrec by 0.020, 0.010 and 0.014 NDCG@10 with standard errors "
            "of 0.0054-0.0055, so whether the gap passed 2 standard errors (0.011) varied by seed; its shortest "
            "history bucket held 70 users (standard error 0.06 of a lead). More test users is the only remedy that "
            "leaves the claim, the models and the margins as they were. ML-100K's size is fixed: this changes only "
            "the synthetic fallback. Verdict before: inconclusive (unstable); after (full scale, this claim alone, "
            "325 s): not supported in all 3 seeds, in the regime (sasrec 5.4x and gru4rec 5.9-6.1x popularity's "
            "NDCG@10): gru4rec led sasrec by 0.017-0.023 (standard error 0.0035) and markov by 0.025-0.026 (0.0087); "
            "sasrec's deficit was smaller for histories of 100-199 (-0.044 to -0.051) than of 3-9 (-0.074 to -0.091) "
            "in every seed, within 2 standard errors of the difference (0.044-0.045)."},
]
CHANGES.append(
    {"date": "2026-12-05", "what": "regime: the neural models trained until they stopped improving",
     "old": REGIME_OLD, "new": REGIME,
     "why": ("Issue 29's independent read: at full scale every sasrec and gru4rec run ended at the 40-s training cap "
             "(train_s 40.1-44.1 s in 679adec), so the comparison was at equal CPU time, possibly with models still "
             "learning, and beating popularity by 2x cannot tell. Each run's epochs and best epoch are now recorded "
             "and the regime asks the best epoch to lie >= 5 epochs before the last. Prediction and threshold "
             "unchanged. Verdict before: not supported (679adec, 3 of 3 seeds); after, on the same data: "
             "inconclusive (regime not reached: the epochs were not recorded, and every run hit the cap).")})
CHANGES.append(
    {"date": "2026-12-06", "what": "method: the neural models trained until they stop improving (prediction, threshold "
                                   "and regime unchanged)",
     "old": "each neural run capped at 40 s of training (2 threads), patience 20 epochs; dropout 0.2 (HPARAMS, tuned on "
            "ML-100K) on the synthetic histories too",
     "new": "each run stops once its validation NDCG@10 has not improved for 5 epochs (the regime's plateau), capped at "
            "600 s of one core; the 6 runs are jobs of the report's training stage, one core each; on the synthetic "
            "histories both models train without dropout (ML-100K keeps 0.2); test users scored once, at the kept "
            "epoch, not after every epoch",
     "why": ("Issue 29: every run of the reference (67ce851) ended at the cap with its best epoch the last, so the "
             "claim sat outside its regime. Probes on the full setting (3,000 synthetic users, model seed 0, one "
             "core, learning rate 2e-3, batch 32; choices read on validation NDCG@10, though the probe printed the "
             "test figure too): with dropout 0.2 sasrec was still rising at 0.2464 after 32 epochs (240 s) and "
             "gru4rec at 0.2341 after 50; a rate of 4e-3 (0.2431 after 40 epochs) or batches of 128 and 256 (the same "
             "time per epoch, 0.2376 and 0.2308 after 26) did not speed it up. Without dropout sasrec reached 0.2546 "
             "at epoch 23 (155 s) and gru4rec 0.2440 at epoch 18 (81 s), both flat after: dropout tuned on 100,000 "
             "ratings held back models fitting 230,000 interactions. Patience 5 (20 before, on ML-100K too) is the "
             "regime's own plateau, so a run stops as soon as it holds and the check tells apart the runs the cap cut "
             "off; a noise spike can end a run early, as at any patience (on ML-100K one patience-10 run stopped "
             "before its best, docs/recommendation.md). The probe used model seed 0, one of the report's, not the "
             "tuning seeds 10 and 11; the change is the same for both neural models. Verdict before: inconclusive "
             "(regime not "
             "reached; the data alone read not supported in 2 seeds of 3, sasrec below gru4rec by 0.005-0.017); after: "
             "the reference run that follows this change.")})
EST_S = {"quick": 10, "full": 30}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 12, "full": 550}  # this claim's share of the training stage (training.py), in seconds
BASELINES = ("markov", "gru4rec")
NEURAL = ("sasrec", "gru4rec")
# quick: small synthetic histories, 1 seed, 5 s of training per model (a smoke run);
# full: ML-100K if cached, 3 seeds, each run trained until its validation score has not improved for PLATEAU epochs
# (what the regime asks), with a cap that only a run still learning reaches.
SCALES = {"quick": {"synthetic": dict(n_users=400, n_items=300, n_topics=30, max_len=80), "seeds": 1, "max_len": 50,
                    "max_epochs": 12, "max_train_s": 5.0},
          "full": {"synthetic": dict(n_users=3000, n_items=800, n_topics=40, max_len=150), "seeds": FULL_REPEATS,
                   "max_len": 50, "max_epochs": 200, "max_train_s": 600.0}}
# On the synthetic histories both neural models train without dropout: with the 0.2 tuned on ML-100K (HPARAMS) sasrec
# was still rising after 32 epochs and gru4rec after 50, and without it both reached a higher validation NDCG@10 and
# stopped improving within 25 (this claim's CHANGES). ML-100K keeps HPARAMS.
SYNTHETIC_HPARAMS = {n: {"dropout": 0.0} for n in NEURAL}
_CACHE: dict = {}  # (scale, device, its settings) -> {model: its runs, seed 0 first}


def _key(scale: str, device: str) -> tuple:
    return scale, str(device), repr(SCALES[scale])


def _setting(scale: str, s: dict | None = None):
    """(the data, its source, FitConfig, hparams overrides) this claim runs at ``scale`` with its settings ``s``
    (SCALES[scale] by default; a worker process is handed them, so that it runs what the parent asked)."""
    from attnlab.recsys.fetch import cached_wheel
    from attnlab.recsys.run import load_data
    from attnlab.recsys.synthetic import SyntheticConfig
    from attnlab.recsys.train import FitConfig

    s = s or SCALES[scale]
    wheel = cached_wheel() if scale == "full" else None
    data = load_data("ml-100k", wheel) if wheel else load_data("synthetic", synthetic=SyntheticConfig(**s["synthetic"]))
    fit = FitConfig(max_epochs=s["max_epochs"], max_train_s=s["max_train_s"], batch_size=32, patience=PLATEAU,
                    test_each_epoch=False)
    return data, "ml-100k" if wheel else "synthetic", fit, None if wheel else SYNTHETIC_HPARAMS


def _fit_job(name: str, seed: int, scale: str, s: dict, device: str) -> dict:
    """One neural model on one seed, as the training stage runs it (training.py): run_one's plain result."""
    from attnlab.recsys.run import run_one
    from attnlab.recsys.split import leave_one_out

    data, _, fit, hparams = _setting(scale, s)
    return run_one(name, leave_one_out(data, s["max_len"]), seed, fit, device=device, per_user=True, hparams=hparams)


def _task(scale: str, device: str):
    """Every neural run of this claim (model x seed), into the cache. Long jobs (100-230 s each at full scale):
    they start first, so the stage's short runs fill the cores at its end."""
    from attnlab.experiments.training import LONG, Job

    key, s = _key(scale, device), SCALES[scale]
    todo = [(name, seed) for name in NEURAL for seed in range(s["seeds"])]
    runs = yield [Job(_fit_job, (name, seed, scale, s, str(device)), LONG) for name, seed in todo]
    _CACHE[key] = {name: [r for (n, _), r in zip(todo, runs) if n == name] for name in NEURAL}


def training(scale: str, device: str) -> dict:
    """This claim's neural runs, for the report's training stage (training.py)."""
    return {} if _key(scale, device) in _CACHE else {("recsys", scale, str(device)): _task(scale, device)}


def _paired(a: list, b: list) -> dict:
    """Mean and standard error of the per-user difference a - b (the same users under both models)."""
    if len(a) != len(b):
        raise ValueError(f"paired comparison of {len(a)} users with {len(b)}: the runs were scored on different users")
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mu = sum(d) / n
    var = sum((x - mu) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    return {"diff": mu, "se": math.sqrt(var / n), "users": n}


def _plateau(run: dict) -> int | None:
    """Epochs trained after the best validation epoch (how long the run had stopped improving), or None."""
    if run.get("epochs") is None or run.get("best_epoch") is None:
        return None
    return run["epochs"] - run["best_epoch"]


def _per_seed(res: dict, seed: int) -> dict:
    """One seed's paired comparisons: sasrec vs each baseline overall, sasrec's lead over the better baseline per
    history-length bucket (better by that bucket's mean), and each model's NDCG@10 over popularity's."""
    from attnlab.recsys.run import BUCKET_EDGES

    users = {n: r["runs"][seed % len(r["runs"])]["user_ndcg"] for n, r in res["models"].items()}
    hist = res["test_history_len"]
    out = {"seed": seed, "vs": {n: _paired(users["sasrec"], users[n]) for n in BASELINES}, "leads": [],
           "over_pop": {n: mean(users[n]) / max(mean(users["pop"]), 1e-12) for n in ("sasrec", "gru4rec")},
           "plateau": {n: _plateau(res["models"][n]["runs"][seed % len(res["models"][n]["runs"])])
                       for n in ("sasrec", "gru4rec")}}
    for lo, hi in zip(BUCKET_EDGES, BUCKET_EDGES[1:] + (None,)):
        sel = [i for i, h in enumerate(hist) if h >= lo and (hi is None or h < hi)]
        if not sel:
            continue
        best = max(BASELINES, key=lambda n: mean([users[n][i] for i in sel]))
        out["leads"].append({"bucket": f"{lo}+" if hi is None else f"{lo}-{hi - 1}", "users": len(sel), "vs": best,
                             **_paired([users["sasrec"][i] for i in sel], [users[best][i] for i in sel])})
    return out


def measure(scale: str, device: str) -> dict:
    from attnlab.experiments import training as stage
    from attnlab.recsys.run import run_recsys

    s = SCALES[scale]
    stage.run_tasks(training(scale, device).values(), stage.workers_for(device))  # done by the stage, unless run alone
    data, source, fit, hparams = _setting(scale)
    res = run_recsys(data, ("sasrec", "gru4rec", "markov", "pop"), s["seeds"], s["max_len"], fit, device=device,
                     per_user=True, hparams=hparams, runs=_CACHE[_key(scale, device)])
    models = {}
    for name, r in res["models"].items():
        seeds = [run["metrics"] for run in r["runs"]]
        n = s["seeds"]  # counting models ran once: their one value stands for every seed
        models[name] = {p: {k: [seeds[i % len(seeds)][p][k] for i in range(n)] for k in seeds[0][p]} for p in seeds[0]}
        models[name]["buckets"] = [{"bucket": b["bucket"], "lo": b["lo"], "users": b["users"],
                                    "ndcg": [r["runs"][i % len(r["runs"])]["buckets"][j]["ndcg"] for i in range(n)]}
                                   for j, b in enumerate(r["runs"][0]["buckets"])]
        models[name]["train_s"] = [run["train_s"] for run in r["runs"]]
        if name in NEURAL:
            models[name]["epochs"] = [run.get("epochs") for run in r["runs"]]
            models[name]["best_epoch"] = [run.get("best_epoch") for run in r["runs"]]
    return {"source": source, "data": res["data"], "protocol": res["protocol"], "fit": res["fit"],
            "hparams": res["hparams"], "seeds": s["seeds"], "device": device, "models": models,
            "per_seed": [_per_seed(res, i) for i in range(s["seeds"])]}


def _beyond(p: dict) -> bool | None:
    """A paired difference beyond max(Z standard errors, MIN_MARGIN): True ahead, False behind, None within."""
    if abs(p["diff"]) <= max(Z * p["se"], MIN_MARGIN):
        return None
    return p["diff"] > 0


def _conditions(s: dict) -> list[dict]:
    conds = [condition(f"{n} NDCG@10 / popularity's", s["over_pop"][n], f">= {LEARNED:g}x",
                       s["over_pop"][n] >= LEARNED, f"{s['over_pop'][n]:.2f}x") for n in ("sasrec", "gru4rec")]
    for n in ("sasrec", "gru4rec"):
        p = s.get("plateau", {}).get(n)
        conds.append(condition(f"{n}'s epochs after its best validation epoch", p, f">= {PLATEAU} (it had stopped "
                               "improving)", p is not None and p >= PLATEAU, "not recorded" if p is None else str(p)))
    big = [b for b in s["leads"] if b["users"] >= MIN_USERS]
    conds.append(condition(f"history-length buckets with >= {MIN_USERS} users", len(big), ">= 2", len(big) >= 2))
    return conds


def decide_seed(s: dict) -> Decision:
    """One seed: sasrec against each baseline overall, and its lead in the longest bucket against the shortest."""
    reasons, ok = [], True
    for name in BASELINES:
        p = s["vs"][name]
        c = _beyond(p)
        reasons.append(f"seed {s['seed']}: sasrec - {name} NDCG@10 {p['diff']:+.4f} (standard error {p['se']:.4f}, "
                       f"{p['users']} users): " + {True: "sasrec ahead", False: f"{name} ahead",
                                                   None: "within the margin"}[c])
        ok = False if c is False or ok is False else (None if c is None else ok)
    big = [b for b in s["leads"] if b["users"] >= MIN_USERS]
    grows = None
    if len(big) >= 2:
        short, long_ = big[0], big[-1]
        trend = {"diff": long_["diff"] - short["diff"], "se": math.hypot(long_["se"], short["se"])}
        grows = _beyond(trend)
        reasons.append(f"seed {s['seed']}: sasrec's lead over the better baseline {short['diff']:+.4f} for histories "
                       f"{short['bucket']} vs {long_['diff']:+.4f} for {long_['bucket']} (difference standard error "
                       f"{trend['se']:.4f}): " + {True: "grows", False: "shrinks", None: "no change beyond the margin"}[grows])
    final = False if ok is False or grows is False else (None if ok is None or grows is None else True)
    leads = ", ".join(f"{b['bucket']}: {b['diff']:+.4f}" for b in big)
    return Decision(verdict(final), f"seed {s['seed']}: sasrec - {BASELINES[0]} {s['vs'][BASELINES[0]]['diff']:+.4f}, "
                                    f"- {BASELINES[1]} {s['vs'][BASELINES[1]]['diff']:+.4f}; lead by history {leads}",
                    reasons)


def decide(m: dict) -> Decision:
    sas = m["models"]["sasrec"]["full"]["ndcg@10"]
    best = max(BASELINES, key=lambda n: mean(m["models"][n]["full"]["ndcg@10"]))
    figure = (f"{m['source']}: full NDCG@10 sasrec {mean(sas):.4f} vs {best} "
              f"{mean(m['models'][best]['full']['ndcg@10']):.4f} (mean of {len(m['per_seed'])} seeds)")
    return over_repeats([in_regime(_conditions(s), decide_seed(s)) for s in m["per_seed"]], figure=figure)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows = [{"model": name, "protocol": p, "hr@10": mean(v[p]["hr@10"]), "ndcg@10": mean(v[p]["ndcg@10"]),
             "ndcg@10 spread": spread(v[p]["ndcg@10"]), "train_s": mean(v["train_s"])}
            for name, v in m["models"].items() for p in ("full", "full_excl_seen", "sampled100")]
    series = [Series(name, [b["lo"] for b in v["buckets"]], [mean(b["ndcg"]) for b in v["buckets"]])
              for name, v in m["models"].items()]
    return Outcome.of(decide(m), m, [Plot(f"NDCG@10 (full ranking) by history length, {m['source']}",
                                          "history length (lower bucket edge, items)", "test NDCG@10", series,
                                          log_x=True)], rows,
                      [f"Data: {m['data']['name']} ({m['source']}). Protocol: {m['protocol']}.",
                       f"Neural models trained on {m['device']}; the counting models (markov, pop) count on the CPU.",
                       f"Each neural run trains until its validation NDCG@10 has not improved for {PLATEAU} epochs "
                       f"(the best epoch's weights kept), or {SCALES[scale]['max_train_s']:.0f} s of training; "
                       "hyperparameters: " + "; ".join(f"{n} {m['hparams'][n]}" for n in NEURAL) + ". ML-100K's "
                       "converged figures are in benchmarks/results/recsys_ml100k.json."],
                      device=m["device"])

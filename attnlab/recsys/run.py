"""Models x seeds on one dataset -> one JSON-able result: metrics under every protocol (mean and spread over seeds),
NDCG@10 by history length, training time and throughput. ``attnlab recsys``, claim 18 and the benchmark call it."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from attnlab.recsys.data import Interactions, load_file
from attnlab.errors import DataError
from attnlab.recsys.metrics import K, N_NEGATIVES, PROTOCOLS, ndcg, summarize
from attnlab.recsys.models import MODELS, NEURAL, build
from attnlab.recsys.split import Split, leave_one_out
from attnlab.recsys.synthetic import SyntheticConfig, generate, scenario
from attnlab.recsys.train import FitConfig, evaluate, fit

# Neural hyperparameters (SASRec paper / RecBole defaults for ML-100K: hidden 64, 2 layers, 2 heads).
HPARAMS = {"sasrec": {"dim": 64, "n_layers": 2, "n_heads": 2, "dropout": 0.2}, "gru4rec": {"dim": 64, "dropout": 0.2}}
MARKOV_BETAS = (0.1, 1.0, 10.0, 100.0)  # smoothing strengths; the one with the best validation NDCG@10 is used
BUCKET_EDGES = (3, 10, 20, 50, 100, 200)  # history length (items before the test item): [3,10), [10,20), ..., [200,)
PROTOCOL_NOTE = ("leave-one-out (last item test, second-to-last validation; the test input includes the validation "
                 "item), stable time sort with ties in file order, inputs truncated to the last {max_len} items; "
                 "HR@10/NDCG@10 by full ranking over all items (seen items ranked too: the default, as RecBole), by "
                 "full ranking excluding seen items, and among 100 uniformly sampled negatives (never the target); "
                 "ties count against the model; test figures of the epoch with the best validation full NDCG@10")


def load_data(spec: str, wheel: Path | None = None, synthetic: SyntheticConfig | None = None) -> Interactions:
    """'ml-100k' (the RecBole wheel, fetched once), 'synthetic' or 'synthetic:PRESET' (synthetic.py), or a path."""
    if spec == "ml-100k":
        from attnlab.recsys.fetch import load_ml100k

        return load_ml100k(wheel)
    if spec == "synthetic":
        return generate(synthetic or SyntheticConfig())
    if spec.startswith("synthetic:"):
        return generate(scenario(spec.split(":", 1)[1]))
    return load_file(spec)


def bucket_label(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else f"{lo}-{hi - 1}"


def by_history(per_user_ndcg: torch.Tensor, history_len: torch.Tensor) -> list[dict]:
    """Mean NDCG@10 per history-length bucket (buckets with no users are left out)."""
    out = []
    for lo, hi in zip(BUCKET_EDGES, BUCKET_EDGES[1:] + (None,)):
        sel = (history_len >= lo) & (history_len < hi if hi is not None else True)
        if int(sel.sum()):
            out.append({"bucket": bucket_label(lo, hi), "lo": lo, "users": int(sel.sum()),
                        "ndcg": float(per_user_ndcg[sel].mean())})
    return out


def _fit_markov(split: Split) -> tuple[torch.nn.Module, dict]:
    best = None
    for beta in MARKOV_BETAS:
        m = build("markov", split.n_items, split.max_len, split.train_sequences, beta=beta)
        val = float(ndcg(evaluate(m, split.valid, split.n_items)["full"]).mean())
        if best is None or val > best[0]:
            best = (val, beta, m)
    return best[2], {"beta": best[1], "val_ndcg": best[0]}


def run_one(name: str, split: Split, seed: int, fit_cfg: FitConfig, progress: bool = False, device: str = "cpu",
            per_user: bool = False, hparams: dict | None = None) -> dict:
    """Train (or count) one model with one seed and score it on the test users. The neural models train on
    ``device``; the counting models count on the CPU. ``per_user``: keep each test user's NDCG@10 (full ranking).
    ``hparams``: {model: {field: value}} over HPARAMS (e.g. another dropout)."""
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    info: dict = {}
    if name in NEURAL:
        kw = {**HPARAMS[name], **(hparams or {}).get(name, {})}
        model = build(name, split.n_items, split.max_len, **kw).to(device)
        info = fit(model, split, replace(fit_cfg, seed=seed), progress=progress, desc=f"{name} seed {seed}")
    elif name == "markov":
        model, info = _fit_markov(split)
        info["train_s"] = time.perf_counter() - t0
    else:
        model = build(name, split.n_items, split.max_len, split.train_sequences)
        info["train_s"] = time.perf_counter() - t0
    ranks = evaluate(model, split.test, split.n_items)
    user_ndcg = ndcg(ranks["full"])
    return {"seed": seed, "metrics": summarize(ranks), "buckets": by_history(user_ndcg, split.test.history_len),
            "wall_s": time.perf_counter() - t0, **info, **({"user_ndcg": user_ndcg.tolist()} if per_user else {})}


def _stats(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "spread": max(values) - min(values), "values": values}


def aggregate(runs: list[dict]) -> dict:
    """Mean and spread (max - min) over seeds of every metric, bucket and timing."""
    out = {"metrics": {p: {m: _stats([r["metrics"][p][m] for r in runs]) for m in runs[0]["metrics"][p]}
                       for p in runs[0]["metrics"]},
           "buckets": [{**b, "ndcg": _stats([r["buckets"][i]["ndcg"] for r in runs])}
                       for i, b in enumerate(runs[0]["buckets"])],
           "train_s": _stats([r["train_s"] for r in runs])}
    for key in ("epoch_s_median", "targets_per_s", "epochs", "best_epoch"):
        if key in runs[0]:
            out[key] = _stats([r[key] for r in runs])
    return out


def run_recsys(data: str | Interactions = "synthetic", models=MODELS, seeds: int = 3, max_len: int = 50,
               fit_cfg: FitConfig | None = None, progress: bool = False, wheel: Path | None = None,
               device: str = "cpu", per_user: bool = False, hparams: dict | None = None,
               runs: dict | None = None) -> dict:
    """Every model x seed on one dataset. ``per_user``: each run keeps its test users' NDCG@10 and the result their
    history lengths (``test_history_len``), for paired comparisons. ``hparams``: as run_one. ``runs``: {model: its
    runs, seed 0 first} made already (by run_one with these arguments, as claim 18's training stage does): used as
    they are."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise ValueError(f"--models {','.join(unknown)}: not known; choose from {','.join(MODELS)}")
    if seeds < 1:
        raise ValueError(f"--seeds {seeds} must be >= 1")
    inter = data if isinstance(data, Interactions) else load_data(data, wheel)
    if inter.n_items <= N_NEGATIVES:
        raise DataError(f"{inter.name}: {inter.n_items} items; the sampled protocol ranks the target among "
                        f"{N_NEGATIVES} other items, so at least {N_NEGATIVES + 1} are needed")
    split = leave_one_out(inter, max_len)
    fit_cfg = fit_cfg or FitConfig()
    out = {"data": inter.describe(), "split": split.describe(), "protocol": PROTOCOL_NOTE.format(max_len=max_len),
           "protocols": list(PROTOCOLS), "k": K, "fit": fit_cfg.to_dict(),
           "hparams": {n: {**h, **(hparams or {}).get(n, {})} for n, h in HPARAMS.items()}, "device": device,
           "models": {}}
    if per_user:
        out["test_history_len"] = split.test.history_len.tolist()
    for name in models:
        # counting models are deterministic: one run stands for every seed
        done = (runs or {}).get(name) or [run_one(name, split, s, fit_cfg, progress, device, per_user, hparams)
                                          for s in (range(seeds) if name in NEURAL else [0])]
        _check_runs(name, done, seeds if name in NEURAL else 1, fit_cfg, split, per_user)
        out["models"][name] = {"runs": done, **aggregate(done)}
    return out


def _check_runs(name: str, done: list, seeds: int, fit_cfg: FitConfig, split: Split, per_user: bool) -> None:
    """Runs made elsewhere must be the ones asked for: one per seed in order, trained with ``fit_cfg``, scored on
    these test users (a per-user comparison would otherwise pair users wrongly)."""
    if len(done) != seeds:
        raise ValueError(f"{name}: {len(done)} runs given for {seeds} seed(s)")
    for i, r in enumerate(done):
        if r["seed"] != i or ("config" in r and r["config"] != replace(fit_cfg, seed=i).to_dict()):
            raise ValueError(f"{name}: run {i} was made with seed {r['seed']} and {r.get('config')}, not with seed {i} "
                             "and the FitConfig asked for; make the runs again with these settings")
        if per_user and len(r.get("user_ndcg") or []) != split.test.targets.numel():
            raise ValueError(f"{name}: run {i} scored {len(r.get('user_ndcg') or [])} test users, this split has "
                             f"{split.test.targets.numel()}: it was made on other data")


def format_table(result: dict) -> str:
    """Plain-text table: one row per model, HR@10 / NDCG@10 per protocol as mean ± spread, then timings."""
    lines = [f"data: {result['data']['name']} ({result['data']['users']} users, {result['data']['items']} items, "
             f"{result['data']['interactions']} interactions)", f"protocol: {result['protocol']}", ""]
    head = f"{'model':<8}" + "".join(f"{p + ' HR@10':>22}{p + ' NDCG@10':>24}" for p in result["protocols"])
    lines.append(head + f"{'train s':>14}{'epoch s':>10}{'targets/s':>11}")
    for name, m in result["models"].items():
        row = f"{name:<8}"
        for p in result["protocols"]:
            for metric, width in (("hr@10", 22), ("ndcg@10", 24)):
                s = m["metrics"][p][metric]
                row += f"{s['mean']:.4f} ± {s['spread']:.4f}".rjust(width)
        row += f"{m['train_s']['mean']:>14.1f}"
        row += f"{m['epoch_s_median']['mean']:>10.2f}" if "epoch_s_median" in m else f"{'-':>10}"
        row += f"{m['targets_per_s']['mean']:>11,.0f}" if "targets_per_s" in m else f"{'-':>11}"
        lines.append(row)
    lines.append("")
    lines.append("± is the spread (max - min) over seeds; markov and pop are deterministic (one run). "
                 "Training time excludes per-epoch evaluation.")
    return "\n".join(lines)

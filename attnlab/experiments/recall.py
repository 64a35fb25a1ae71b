"""Recall, learned: the models that claims 3 and 8 measure, trained once per report run.

Two tasks share the machinery: MQAR (claim 8: how many bindings a model holds) and marked recall (claim 3: one
token carried across d dependent steps, ``Setup.task == "marked"``, marked_recall_batch).

Zoology (Arora et al. 2023) showed that MQAR separates attention from fixed-state models only when every
model is trained properly: enough distinct examples, a learning-rate sweep per family with the best chosen
on validation data, equal heads and parameter budgets. This module does that at CPU scale:

- fresh examples every step (``recall_batch``: no example is seen twice), the key-value pairs scattered
  among irrelevant filler tokens, queries back to back after the context, a mixture of pair counts;
- every family at the transformer's parameter count within +-10% (width searched per family), the same
  number of heads for every attention-type mixer, the same steps, batch and data;
- each learning rate of ``Setup.lrs`` (or the family's own, ``Setup.family_lrs``) trained on seed 0 and scored on
  a validation draw; when the best is at an end of the sweep, the sweep is extended past that end (up to
  ``MAX_EXTEND`` more rates, ``next_rates``) so the best rate is bracketed; the best one is trained on the other
  seeds (``Setup.family_seeds``: fewer for a family a claim only shows; ``Setup.seed_gates``: none when seed 0
  misses the claim's regime, which no other seed can then restore); test accuracy per number of pairs (MQAR:
  Zoology's curve) or per distance (marked recall) on a third draw.

The training recipe below (untied embeddings, init std 0.07, Adam beta2 0.999, no clipping, constant rate
after warm-up) is what let a 2-layer transformer form its induction circuit in a few hundred steps: with
the language-model defaults (tied embeddings, std 0.02, beta2 0.95, clipping, cosine decay) it sat at
24% for 2,000 steps on the same data, the plateau the report used to show. Every family gets it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.synthetic import IGNORE, marked_recall_batch, recall_batch
from attnlab.experiments import training
from attnlab.experiments.training import Job
from attnlab.models import build_model
from attnlab.fit import fit, lm_loss

# Model and optimiser fields every family trains with (see the module docstring for why).
MODEL_RECIPE = dict(tie_embeddings=False, init_std=0.07, n_layers=2)
TRAIN_RECIPE = dict(beta2=0.999, grad_clip=0.0, min_lr_ratio=1.0, weight_decay=0.0)

# name -> ModelConfig fields. "transformer" is exact softmax attention (sdpa); the others are the
# recurrent baselines (claim 3) and the remedies for quadratic cost (claim 8).
MODEL_FIELDS = {
    "transformer": {},
    "lstm": dict(family="lstm", fused=True),  # torch's fused kernel: the same recurrence, trainable in minutes
    "gru": dict(family="gru", fused=True),
    "rnn": dict(family="rnn", fused=True),
    "ssm": dict(family="ssm", pos="none", scan="sequential"),  # at T <= 64 the loop is ~10x cheaper to train than
    # the log-depth scan, whose (B, T, E, N) passes dominate; the same recurrence either way
    "linear": dict(family="linear", pos="none"),
    "sliding": dict(kernel="sliding", window=8),
    "block_sparse": dict(kernel="block_sparse", block_size=8),
}


@dataclass(frozen=True)
class Setup:
    seq_len: int
    vocab: int
    dim: int  # the transformer's width; the others are matched to its parameter count
    heads: int
    steps: int
    batch: int
    lrs: tuple  # the sweep; the best on validation data is kept
    seeds: int
    test_n: int  # test sequences per point of the test axis
    task: str = "mqar"  # or "marked": one marked token recalled at a distance (marked_recall_batch)
    train_pairs: tuple = ()  # MQAR: pair counts, cycled step by step
    test_pairs: tuple = ()  # MQAR: Zoology's x axis
    filler: tuple = (0, 0)  # MQAR: (lo, hi) irrelevant tokens among the pairs, drawn per sequence
    filler_from: float = 0.0  # MQAR: fraction of training done before filler appears (see train())
    test_distances: tuple = ()  # marked recall: the x axis, value-to-query distances
    n_queries: int = 8  # marked recall: queries per training sequence
    family_lrs: tuple = ()  # ((family, rates), ...): where a family's sweep starts instead of ``lrs``
    family_seeds: tuple = ()  # ((family, seeds), ...): fewer seeds for a family whose recall is shown, not decided
    seed_gates: tuple = ()  # ((family, accuracy), ...): other seeds train only if seed 0 reaches it at min(test_at)

    @property
    def test_at(self) -> tuple:
        """The test axis: pair counts (MQAR) or distances (marked recall)."""
        return self.test_distances if self.task == "marked" else self.test_pairs

    def lrs_of(self, name: str) -> tuple:
        return dict(self.family_lrs).get(name, self.lrs)

    def seeds_of(self, name: str) -> int:
        return dict(self.family_seeds).get(name, self.seeds)

    def gate_of(self, name: str) -> float | None:
        return dict(self.seed_gates).get(name)


# Claim 8's regime: what a model must reach at the smallest pair count, on the test draw, for its recall to be read:
# exact attention LEARNED, a remedy REMEDY_LEARNED (e08_remedies.py states why).
LEARNED, REMEDY_LEARNED = 0.9, 0.5
SETUPS = {
    "quick": Setup(seq_len=40, vocab=64, train_pairs=(4, 8), test_pairs=(2, 4, 8), filler=(0, 8), filler_from=0.5,
                   dim=64, heads=4, steps=800, batch=32, lrs=(1e-3,), seeds=1, test_n=256),
    "full": Setup(seq_len=64, vocab=128, train_pairs=(4, 8, 16), test_pairs=(4, 8, 12, 16), filler=(0, 12),
                  filler_from=0.5, dim=64, heads=4, steps=1200, batch=32, lrs=(3e-4, 1e-3, 3e-3), seeds=3, test_n=512,
                  family_lrs=(("linear", (3e-3, 9e-3, 2.7e-2)), ("ssm", (3e-3, 9e-3, 2.7e-2)), ("sliding", (1e-3,)),
                              ("block_sparse", (1e-3,))),
                  family_seeds=(("sliding", 1), ("block_sparse", 1)),
                  seed_gates=(("transformer", LEARNED), ("linear", REMEDY_LEARNED), ("ssm", REMEDY_LEARNED))),
}
# Linear attention's sweep starts where the shared one, extended twice past its top, found its best (9e-3, claim 8's
# CHANGES): the same rates, two fewer runs. The SSM's starts around the best that its sweep, extended past its top,
# found in a reference run (claim 8's CHANGES); the extension rule still reaches below 3e-3 if that were best.
# The sliding window's and block_sparse's recall is shown, not decided (claim 8's THRESHOLD says why): one seed at
# one rate shows each. A
# decided family whose seed 0 misses claim 8's regime at the smallest pair count trains no other seed: that repetition
# alone makes the verdict "regime not reached", whatever the others read.
# Marked recall (claim 3): tested up to 3T/4, where every distance is trained often (half the marks sit early); a
# distance near T - 2 needs a mark in the first positions, which training draws rarely, and every family is
# undertrained there. At full scale the steps and queries are what the tanh RNN, the slowest family to learn even
# d = 1, needs to pass the regime's 50% there on every seed (claim 3's CHANGES has the probes); the quick scale
# (one rate, no sweep to bracket) only checks that the pipeline runs.
MARKED = {
    "quick": Setup(task="marked", seq_len=32, vocab=64, test_distances=(1, 2, 4, 8, 16, 20, 24), dim=64, heads=4,
                   steps=800, batch=32, lrs=(1e-3,), seeds=1, test_n=256),
    "full": Setup(task="marked", seq_len=48, vocab=128, test_distances=(1, 2, 4, 8, 16, 24, 28, 32, 36), dim=64,
                  heads=4, steps=2000, batch=32, lrs=(3e-4, 1e-3, 3e-3), seeds=3, test_n=512, n_queries=12,
                  family_lrs=(("transformer", (1e-3, 3e-3, 9e-3)), ("lstm", (1e-3, 3e-3, 9e-3)),
                              ("rnn", (9e-5, 3e-4, 1e-3)))),
}
# The transformer's, the LSTM's and the tanh RNN's sweeps start at the three rates around the best that the shared
# sweep, extended past one end, found for them (3e-3, 3e-3 and 3e-4: claim 3's CHANGES); the same extension rule
# applies.

VALIDATION_SEED, TEST_SEED = 7, 99
MAX_EXTEND = 2  # rates added past an end of the sweep, at most, per family

# A change of method that claims 3 and 8 both record (their CHANGES list it): the SSM claim 8 trains is this one, as
# was claim 3's while it measured recall on MQAR.
SSM_INIT_CHANGE = {
    "date": "2026-11-30", "what": "method: the SSM's step sizes start as Mamba's (Delta log-uniform in [1e-3, 1e-1])",
    "old": "dt bias zeroed by the model's init: Delta started at softplus(0) = 0.69",
    "new": "dt bias = softplus^-1(Delta), Delta log-uniform in [1e-3, 1e-1] (Gu & Dao 2023)",
    "why": ("A baseline fault, found before the full-scale run: with Delta = 0.69 the state decays by exp(-0.69 n) "
            "a token, and the SSM stayed at chance on MQAR (5% at quick scale, loss at log(values)); with Mamba's "
            "init it reached 52% / 33% / 24% at 2 / 4 / 8 pairs in 400 steps. Predictions and thresholds unchanged."),
}
# The same for the short convolution that linear attention and the SSM now run before their state (short_conv.py).
SHORT_CONV_CHANGE = {
    "date": "2026-12-05",
    "what": "method: linear attention and the SSM get the short causal convolution of Based and Mamba (width 4)",
    "old": "q, k, v (linear attention) and u (the SSM) read straight from the input projection: no convolution",
    "new": "a depthwise causal convolution of width 4, then SiLU, on linear attention's q, k, v and on the SSM's u "
           "(ModelConfig.short_conv = 4); its last 3 inputs are part of the fixed-size state",
    "why": ("A baseline fault, found while the recall half sat outside its regime: Based and Mamba, the models Zoology "
            "compares with attention, both have this convolution, and it is what lets a fixed state bind a key to the "
            "value after it. Without it both stayed near guessing among the values in context at 4 pairs in every "
            "reference run (linear 28-29%, SSM 28-43%, 19e67a4). Probes of this setup (1,200 steps, one seed each): "
            "linear attention at 1e-3 29% -> 96-98% at 4 pairs (79-82% at 16) in 2 runs; the SSM 64%, 29%, 29%, "
            "29% in 4 runs (two initialisations of the convolution, rates 1e-3 and 3e-3): it learns in some "
            "runs, not in most. Predictions, thresholds and regimes unchanged. Verdict before: inconclusive (regime "
            "not reached); after: the reference run that follows this change."),
}
# The same for the SSM's output gate (ssm.py): claim 8 trains this SSM; claim 3 shows its gradient at initialisation.
SSM_GATE_CHANGE = {
    "date": "2026-12-06", "what": "method: the SSM's output gate starts open, silu(z + b) with b learned per channel "
                                  "from 2 (ModelConfig.ssm_gate_bias)",
    "old": "Mamba's gate silu(z), no bias",
    "new": "silu(z + b), b a learned per-channel bias initialised at 2 (silu(2 + z) ~ 1.76 + 1.09 z at init)",
    "why": ("A baseline fault, found while claim 8's recall half sat outside its regime: with silu(z) ~ z / 2 at init "
            "the block's output is a product of two small terms, and so is its gradient; the SSM read 28.8-29.2% at 4 "
            "pairs (guessing among the 4 values in context) at every rate and seed in every reference run since the "
            "short convolution (07b5717 to 9a6f8d1). The scan (the compiled loop matches float64 to 1e-7), Delta's "
            "init, per-head B/C, the query format and width or depth were each ruled out by probes. Probes of this "
            "setup (1,200 steps, seed 0, the report's recipe) at 4 / 8 / 12 / 16 pairs: the gate removed 98 / 92 / 84 "
            "/ 73%; a fixed silu(z + 2) 99 / 96 / 90 / 84%; the learned bias from 2 at 3e-3 99 / 95 / 88 / 79% (seeds "
            "1 and 2: 99 / 96 / 91 / 84% and 97 / 89 / 79 / 68%), at 1e-3 29%. An open gate at init is the same remedy "
            "as an LSTM's forget-gate bias of 1 (Jozefowicz et al. 2015). Predictions, thresholds and regimes "
            "unchanged. Verdict before: claim 8 inconclusive (regime not reached); after: the reference run that "
            "follows this change. Claim 3: verdict unaffected (the SSM's gradient is shown, not decided)."),
}
_CACHE: dict = {}


def setup_of(scale: str, task: str = "mqar") -> Setup:
    return (MARKED if task == "marked" else SETUPS)[scale]


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def model_config(name: str, setup: Setup, dim: int | None = None) -> ModelConfig:
    return ModelConfig(vocab_size=setup.vocab, dim=dim or setup.dim, n_heads=setup.heads, max_seq_len=setup.seq_len,
                       **MODEL_RECIPE, **MODEL_FIELDS[name])


def matched_config(name: str, setup: Setup) -> ModelConfig:
    """The width whose parameter count is closest to the transformer's (searched in steps of twice the head count,
    so every attention-type mixer keeps ``setup.heads`` heads of an even width)."""
    target = n_params(build_model(model_config("transformer", setup), "meta"))
    best = min(range(setup.heads * 2, setup.dim * 4 + 1, setup.heads * 2),
               key=lambda d: abs(n_params(build_model(model_config(name, setup, d), "meta")) - target))
    return model_config(name, setup, best)


def train(cfg: ModelConfig, setup: Setup, lr: float, seed: int, device: str):
    torch.manual_seed(seed)
    model = build_model(cfg, device)
    tc = TrainConfig(lr=lr, steps=setup.steps, warmup_steps=max(1, setup.steps // 20), **TRAIN_RECIPE)
    g = torch.Generator().manual_seed(1000 + seed)  # drawn on the CPU: the same data on every device

    def step_loss(step: int) -> torch.Tensor:
        if setup.task == "marked":
            x, y, _ = marked_recall_batch(setup.batch, setup.seq_len, setup.vocab, g, n_queries=setup.n_queries)
            return lm_loss(model(x.to(device))[0], y.to(device))
        pairs = setup.train_pairs[step % len(setup.train_pairs)]
        # Filler only after the first part: the recall circuit forms on clean pairs (with filler from the start
        # a 2-layer transformer stayed at chance for 800 steps), then learns to look past irrelevant tokens.
        filler = setup.filler if step >= setup.filler_from * setup.steps else (0, 0)
        x, y, _ = recall_batch(setup.batch, setup.seq_len, setup.vocab, pairs, g, filler=filler,
                               n_queries=setup.seq_len - 2 * pairs - setup.filler[1])
        return lm_loss(model(x.to(device))[0], y.to(device))

    return fit(model, step_loss, tc).eval()


@torch.no_grad()
def accuracy(model, setup: Setup, at: int, seed: int, device: str, n: int | None = None, **batch_kw) -> dict:
    """Accuracy at ``at`` on the test axis. MQAR (``at`` pairs): over every query, and over queries whose key is
    in the near / far half of the distances; by default on the training distribution's filler. Marked recall
    (``at``: the distance): {"acc"}, one query a sequence."""
    g = torch.Generator().manual_seed(seed)
    if setup.task == "marked":
        x, y, info = marked_recall_batch(n or setup.test_n, setup.seq_len, setup.vocab, g, distance=at)
    else:
        batch_kw.setdefault("filler", setup.filler)
        x, y, info = recall_batch(n or setup.test_n, setup.seq_len, setup.vocab, at, g, **batch_kw)
    pred = model(x.to(device))[0].argmax(-1).cpu()
    mask = y != IGNORE
    right = (pred == y) & mask
    if setup.task == "marked":
        return {"acc": float(right.sum()) / int(mask.sum())}
    near = mask & (info["distance"] <= setup.seq_len // 2)
    far = mask & (info["distance"] > setup.seq_len // 2)
    acc = lambda m: float(right[m].sum()) / int(m.sum()) if int(m.sum()) else None
    return {"acc": acc(mask), "near": acc(near), "far": acc(far)}


def _train_job(name: str, setup: Setup, lr: float, seed: int, device: str) -> dict:
    """One training run, as the training stage runs it (training.py): the weights as plain tensors."""
    model = train(matched_config(name, setup), setup, lr, seed, device)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _validation(model, setup: Setup, device: str) -> float:
    """Mean validation accuracy over the test axis: what the sweep ranks learning rates by."""
    return sum(accuracy(model, setup, p, VALIDATION_SEED, device)["acc"] for p in setup.test_at) / len(setup.test_at)


def _family(name: str, scale: str, device: str, task: str = "mqar"):
    """One family's training as a task of the training stage: each rate of the sweep on seed 0, scored on a
    validation draw; while the best is at an end of the sweep, one rate past that end (up to ``MAX_EXTEND``); the
    other seeds at the best rate (none if seed 0 misses its gate, ``Setup.seed_gates``); then the test, into the
    cache."""
    setup = setup_of(scale, task)
    cfg = matched_config(name, setup)

    def runs(todo: list) -> list:  # [(lr, seed)] -> their models, built from the weights the jobs return
        weights = yield [Job(_train_job, (name, setup, lr, seed, str(device))) for lr, seed in todo]
        out = []
        for w in weights:
            model = build_model(cfg, device)
            model.load_state_dict(w)
            out.append(model.eval())
        return out

    sweep = dict(zip(setup.lrs_of(name), (yield from runs([(lr, 0) for lr in setup.lrs_of(name)]))))
    val = {lr: _validation(m, setup, device) for lr, m in sweep.items()}
    for _ in range(MAX_EXTEND):  # a best rate at an end of the sweep may only be the best of too narrow a sweep
        extra = next_rates(val)
        if not extra:
            break
        for lr, m in zip(extra, (yield from runs([(lr, 0) for lr in extra]))):
            sweep[lr], val[lr] = m, _validation(m, setup, device)
    best = best_rate(val)
    first = {p: accuracy(sweep[best], setup, p, TEST_SEED, device) for p in setup.test_at}  # seed 0's test
    gate, n_seeds = setup.gate_of(name), setup.seeds_of(name)
    if gate is not None and first[min(setup.test_at)]["acc"] < gate:
        n_seeds = 1  # the very figure the claim's regime reads for seed 0: it missed the bar
    more = yield from runs([(best, s) for s in range(1, n_seeds)])
    seeds = [sweep[best]] + more
    test = {p: [first[p]] + [accuracy(m, setup, p, TEST_SEED, device) for m in more] for p in setup.test_at}
    _CACHE[(task, name, scale, str(device))] = {"params": n_params(seeds[0]), "dim": cfg.dim, "lr_sweep": val,
                                                "best_lr": best, "lr_bracketed": bracketed(val, best), "models": seeds,
                                                "test": test, "config": asdict(cfg)}


def tasks(names, scale: str, device: str, task: str = "mqar") -> dict:
    """The training-stage tasks (training.py) of every family of ``names`` not yet cached, by a key that claims
    sharing a family share; the slowest to train first (the recurrent-state families loop over T), so the last jobs
    to start are short ones."""
    names = [n for n in dict.fromkeys(names) if (task, n, scale, str(device)) not in _CACHE]
    return {("recall", task, n, scale, str(device)): _family(n, scale, device, task)
            for n in sorted(names, key=lambda n: n not in ("ssm", "gru", "sliding", "linear"))}


def prefetch(names, scale: str, device: str, workers: int | None = None, task: str = "mqar") -> None:
    """Train every family of ``names`` not yet cached, side by side (training.run_tasks): the report's training stage
    has usually done so already."""
    training.run_tasks(tasks(names, scale, device, task).values(), workers or training.workers_for(device))


def best_rate(val: dict) -> float:
    """The rate of ``val`` ({lr: validation accuracy}) with the best accuracy; among equal ones, one inside the sweep."""
    rates = sorted(val, key=float)
    return max(rates, key=lambda lr: (val[lr], float(rates[0]) < float(lr) < float(rates[-1])))


def bracketed(val: dict, best=None) -> bool:
    """Is the best rate strictly inside a sweep of >= 3 rates (so it is not the best only for want of a wider sweep)?
    ``val``'s keys may be strings (read back from results.json)."""
    rates = sorted(float(k) for k in val)
    best = float(best_rate(val) if best is None else best)
    return len(rates) >= 3 and rates[0] < best < rates[-1]


def next_rates(val: dict) -> list:
    """The rate to try next when the best of ``val`` ({lr: validation accuracy}, >= 2 rates) is at an end of the
    sweep: one more step past that end, the step being the ratio of the two rates at that end; [] when the best
    is inside the sweep (bracketed), or with fewer than 2 rates (no sweep to extend)."""
    rates = sorted(val)
    if len(rates) < 2:
        return []
    best = best_rate(val)
    if best == rates[0]:
        return [rates[0] * rates[0] / rates[1]]
    if best == rates[-1]:
        return [rates[-1] * rates[-1] / rates[-2]]
    return []


def trained(name: str, scale: str, device: str, task: str = "mqar") -> dict:
    """Sweep, pick, retrain on more seeds, test: {"params", "dim", "lr_sweep", "best_lr", "lr_bracketed", "models",
    "test"}.
    test[pairs or distance] = one accuracy dict per seed. Cached for the run, so claims share the same models."""
    prefetch([name], scale, device, task=task)
    return _CACHE[(task, name, scale, str(device))]


def by_int(d: dict) -> dict:
    """Integer keys back from results.json, where JSON made them strings; decide() reads either."""
    return {int(k): v for k, v in d.items()}


def summary(name: str, scale: str, device: str, task: str = "mqar") -> dict:
    """What goes into results.json: everything but the models."""
    t = trained(name, scale, device, task)
    return {k: v for k, v in t.items() if k != "models"}


def setup_dict(scale: str, task: str = "mqar") -> dict:
    return {**asdict(setup_of(scale, task)), "model_recipe": MODEL_RECIPE, "train_recipe": TRAIN_RECIPE}


def with_steps(scale: str, steps: int, task: str = "mqar") -> Setup:
    """A cheaper copy of a setup, for tests."""
    return replace(setup_of(scale, task), steps=steps)


@torch.no_grad()
def attention_maps(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Softmax attention weights of every layer of a transformer, [(B, H, T, T)] * n_layers, recomputed from the
    inputs each attention layer sees (the kernels never form the matrix, so it is rebuilt here from q and k)."""
    seen = []
    hooks = [b.attn.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0], args[1])))
             for b in model.backbone.blocks]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    maps = []
    for mod, h, positions in seen:
        B, T, _ = h.shape
        H, Hkv, D = mod.n_heads, mod.n_kv_heads, mod.head_dim
        q, k, _ = mod.wqkv(h).split((H * D, Hkv * D, Hkv * D), dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # (B, H, T, D)
        q, k = model.pos_enc.rotate(q, k, positions)
        scores = (q @ k.transpose(-1, -2)) * mod.scale  # (B, H, T, T)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        maps.append(scores.softmax(-1))
    return maps

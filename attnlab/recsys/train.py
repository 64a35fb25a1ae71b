"""One training loop for the neural recommenders, and the evaluation every model shares.

Each step takes a batch of training windows (split.py) and puts a loss at every position at once:
``ce`` = cross-entropy over all items (the default; "Revisiting SASRec", Klenitskiy & Vasilev, RecSys 2023, found it
best) or ``bce`` = the SASRec paper's binary cross-entropy with one random negative per position; padding positions
are never scored. Each epoch cuts the histories into windows at new places (``shift_windows``, split.epoch_windows).
AdamW, its learning rate set per step by ``lr_factor`` (optional warm-up, then constant or decaying
to 0 at ``max_epochs``, counted in steps so a run does not depend on the machine's speed). After every
epoch the model (with ``ema``, the moving average of its weights) is scored on the validation users (full-ranking
NDCG@10) and training stops when that has not improved for ``patience`` epochs; the best epoch's weights are
restored. Test metrics are recorded per epoch (``test_each_epoch``) for the learning curve only: nothing is chosen
on them.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from attnlab.fit import fit as run_steps
from attnlab.recsys.metrics import K, protocol_ranks, sample_negatives, summarize
from attnlab.recsys.split import EvalSet, Split, epoch_windows

LOSSES = ("ce", "bce")
SCHEDULES = ("constant", "cosine", "linear")
NEGATIVES_SEED = 2024  # one fixed draw of sampled negatives, identical for every model and seed


@dataclass
class FitConfig:
    """How a neural recommender trains. Each default was chosen on ML-100K validation NDCG@10 with seeds the report
    never uses (10 and 11); docs/recommendation.md keeps the tuning record behind each."""
    loss: str = "ce"
    lr: float = 2e-3  # the best rate once windows shift and weights are averaged (without them, 1e-3)
    weight_decay: float = 0.0
    batch_size: int = 32  # training windows per step: more steps per epoch beat larger batches here
    max_epochs: int = 200
    # Early stopping, in epochs. 20, not 10: validation NDCG@10 is noisy from epoch to epoch at a constant learning
    # rate, and 10 stopped a tuning run on an early spike, before its best epoch.
    patience: int = 20
    max_train_s: float | None = None  # stop once this much training time is spent (None: no cap)
    seed: int = 0
    # Learning rate after warm-up: constant, or cosine / linear decay to 0 at max_epochs. Constant: decaying the rate
    # let the model overfit the small training set (lower validation NDCG@10 at every rate tried).
    schedule: str = "constant"
    warmup_epochs: float = 0.0  # linear warm-up from 0 over this many epochs (counted in steps)
    beta1: float = 0.9  # AdamW's betas; 0.999 scored above the SASRec paper's 0.98
    beta2: float = 0.999
    shift_windows: bool = True  # new window cuts each epoch (split.epoch_windows) instead of the fixed ones
    # > 0: evaluate and keep an exponential moving average of the weights, this decay per optimizer step (with
    # shifted windows, the best of the settings tried).
    ema: float = 0.99
    # "ce" only: the share of each target's probability spread evenly over every item (ahead of 0 in most paired
    # tuning runs).
    label_smoothing: float = 0.1
    # Score the test users after every epoch too (the learning curve the benchmark reads); False: only the kept
    # epoch's test figures, which saves a full ranking of every test user per epoch.
    test_each_epoch: bool = True

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not known; choose one of: {', '.join(LOSSES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} is not known; choose one of: {', '.join(SCHEDULES)}")
        if not 0 <= self.warmup_epochs < self.max_epochs:
            raise ValueError(f"warmup_epochs={self.warmup_epochs!r} must be >= 0 and below max_epochs={self.max_epochs}")
        for name in ("beta1", "beta2", "ema", "label_smoothing"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        for name in ("lr", "batch_size", "max_epochs", "patience"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")

    def to_dict(self) -> dict:
        return asdict(self)


def model_device(model) -> torch.device:
    """Where a model's weights (or, for the counting models, its buffers) live; the CPU when it has neither."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


@torch.no_grad()
def scores(model, ev: EvalSet, batch_size: int = 256) -> torch.Tensor:
    """(U, n_items + 1) scores after each user's input, in eval mode, on the CPU (the inputs go to the model)."""
    was = model.training
    model.eval()
    dev = model_device(model)
    out = [model.score_last(ev.inputs[i:i + batch_size].to(dev), ev.lengths[i:i + batch_size].to(dev)).cpu()
           for i in range(0, ev.inputs.shape[0], batch_size)]
    model.train(was)
    return torch.cat(out)


def evaluate(model, ev: EvalSet, n_items: int) -> dict:
    """{protocol: (U,) ranks}: full, full_excl_seen, sampled100 (metrics.py)."""
    negatives = sample_negatives(ev.targets, n_items, generator=torch.Generator().manual_seed(NEGATIVES_SEED))
    return protocol_ranks(scores(model, ev), ev.targets, ev.seen, negatives)


def lr_factor(step: int, steps_per_epoch: int, cfg: FitConfig) -> float:
    """The learning rate at optimizer step ``step`` (0-based) as a share of cfg.lr: linear warm-up over
    warmup_epochs, then constant or a cosine / linear decay that reaches 0 at the end of max_epochs. Counted in
    steps, not seconds, so a run is the same however fast the machine is."""
    warmup, total = cfg.warmup_epochs * steps_per_epoch, cfg.max_epochs * steps_per_epoch
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    done = min(1.0, (step - warmup) / max(1.0, total - warmup))  # share of the decay behind us
    return 0.5 * (1 + math.cos(math.pi * done)) if cfg.schedule == "cosine" else 1.0 - done


def _loss(model, windows: torch.Tensor, cfg: FitConfig, n_items: int, gen: torch.Generator,
          skip: torch.Tensor | None = None) -> torch.Tensor:
    inputs, targets = windows[:, :-1], windows[:, 1:]  # (B, T) each; 0 = padding, no loss there
    if skip is not None:  # (B,) leading targets another window scores this epoch: context only here
        targets = targets.masked_fill(torch.arange(targets.shape[1], device=targets.device) < skip[:, None], 0)
    h = model.hidden(inputs)  # (B, T, dim)
    if cfg.loss == "ce":
        real = targets != 0  # score only real positions: ~19% of ML-100K's window positions are padding
        logits = h[real] @ model.item_emb.weight.t()  # (N, V): the model's own scores, as forward() gives them
        return F.cross_entropy(logits, targets[real], label_smoothing=cfg.label_smoothing)
    neg = torch.randint(1, n_items, targets.shape, generator=gen).to(targets.device)  # drawn on the CPU: seeded alike
    neg = neg + (neg >= targets).long()  # uniform over items other than the target
    emb = model.item_emb
    pos_s, neg_s = (h * emb(targets)).sum(-1), (h * emb(neg)).sum(-1)  # (B, T)
    real = targets != 0
    return -(F.logsigmoid(pos_s) + F.logsigmoid(-neg_s))[real].mean()


def fit(model, split: Split, cfg: FitConfig, progress: bool = False, desc: str = "train") -> dict:
    """Train ``model`` on ``split`` in place (the one training loop, attnlab.fit.fit, with this file's loss and
    epochs); returns the history and timings (training time excludes evaluation)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dev = model_device(model)  # batches are cut on the CPU and sent there
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                            betas=(cfg.beta1, cfg.beta2))
    windows, skip = split.train_windows, None
    if cfg.shift_windows:  # shifted cuts make more windows than the fixed ones (one more per shifted history)
        windows, skip = epoch_windows(split.train_sequences, split.max_len, gen)
    # The schedule's epoch length: the first epoch's step count (shifted cuts vary by a few windows per epoch).
    steps_per_epoch = math.ceil(windows.shape[0] / cfg.batch_size)
    averaged = copy.deepcopy(model) if cfg.ema else model  # what is evaluated and kept
    epochs = _Epochs(split, cfg, gen, windows, skip)
    history, best = [], {"ndcg": -1.0, "state": None, "since": 0}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.max_epochs, desc=desc, unit="epoch", leave=False)

    def step_loss(step: int) -> torch.Tensor:
        rows, rows_skip = epochs.next_batch()
        return _loss(model, rows.to(dev), cfg, split.n_items, gen, None if rows_skip is None else rows_skip.to(dev))

    def after_step(d) -> bool:
        """The moving average, then at an epoch's end its validation score, the best weights, and the stop."""
        if cfg.ema:
            with torch.no_grad():
                torch._foreach_lerp_(list(averaged.parameters()), list(model.parameters()), 1 - cfg.ema)
        epochs.add_loss(d.loss.item())
        if not epochs.ended():
            return False
        epoch, loss, epoch_s = epochs.close()
        t1 = time.perf_counter()
        val = summarize({"full": evaluate(averaged, split.valid, split.n_items)["full"]})["full"][f"ndcg@{K}"]
        test = (summarize({"full": evaluate(averaged, split.test, split.n_items)["full"]})["full"][f"ndcg@{K}"]
                if cfg.test_each_epoch else None)
        history.append({"epoch": epoch, "loss": loss, "epoch_s": epoch_s, "train_s": epochs.train_s,
                        "eval_s": time.perf_counter() - t1, "val_ndcg": val, "test_ndcg": test})
        if val > best["ndcg"]:
            best.update(ndcg=val, state=copy.deepcopy(averaged.state_dict()), since=0)
        else:
            best["since"] += 1
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.3f}", val_ndcg=f"{val:.4f}", best=f"{best['ndcg']:.4f}")
            bar.update(1)
        return (epoch == cfg.max_epochs or best["since"] >= cfg.patience
                or (cfg.max_train_s is not None and epochs.train_s >= cfg.max_train_s))

    run_steps(model, step_loss, optimizer=opt, lr=lambda step: cfg.lr * lr_factor(step, steps_per_epoch, cfg),
              after_step=after_step)
    if bar is not None:
        bar.close()
    model.load_state_dict(best["state"])
    model.eval()
    best_epoch = max(history, key=lambda h: (h["val_ndcg"], -h["epoch"]))["epoch"]
    epoch_times = sorted(h["epoch_s"] for h in history)
    n_targets, train_s = split.n_train_targets, epochs.train_s
    return {"history": history, "best_epoch": best_epoch, "epochs": len(history), "train_s": train_s,
            "epoch_s_median": epoch_times[len(epoch_times) // 2], "train_targets_per_epoch": n_targets,
            "targets_per_s": n_targets * len(history) / train_s if train_s else None, "config": cfg.to_dict()}


class _Epochs:
    """The batches of each epoch in a fresh random order (with ``shift_windows``, from histories cut anew after the
    first epoch), and each epoch's mean loss and training time (evaluation left out)."""

    def __init__(self, split: Split, cfg: FitConfig, gen: torch.Generator, windows, skip):
        self.split, self.cfg, self.gen = split, cfg, gen
        self.windows, self.skip = windows, skip
        self.epoch, self.order, self.at = 0, None, 0
        self.total, self.steps, self.t0, self.train_s = 0.0, 0, 0.0, 0.0

    def next_batch(self):
        """(windows (B, T+1), leading targets to skip (B,) or None) of the next step."""
        if self.order is None:  # a new epoch: drawn now, after the last one was scored, as the generator expects
            self.epoch += 1
            self.t0 = time.perf_counter()
            if self.cfg.shift_windows and self.epoch > 1:
                self.windows, self.skip = epoch_windows(self.split.train_sequences, self.split.max_len, self.gen)
            self.order, self.at = torch.randperm(self.windows.shape[0], generator=self.gen), 0
        rows = self.order[self.at:self.at + self.cfg.batch_size]
        self.at += self.cfg.batch_size
        return self.windows[rows], None if self.skip is None else self.skip[rows]

    def add_loss(self, loss: float) -> None:
        """Count one step's loss towards the epoch's mean."""
        self.total, self.steps = self.total + loss, self.steps + 1

    def ended(self) -> bool:
        """Whether the last batch drawn was the epoch's last."""
        return self.at >= len(self.order)

    def close(self) -> tuple[int, float, float]:
        """(epoch, its mean loss, its training seconds), and the next batch starts a new epoch."""
        epoch_s = time.perf_counter() - self.t0
        self.train_s += epoch_s
        out = (self.epoch, self.total / max(1, self.steps), epoch_s)
        self.order, self.total, self.steps = None, 0.0, 0
        return out

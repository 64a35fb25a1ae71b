"""The one training loop, ``fit``, and what every trainer shares: the learning-rate schedule, the optimizer, the
language-model and distillation losses, held-out evaluation.

``fit(model, step_loss, cfg)`` takes a built model and runs the steps: each sets the schedule's learning rate, takes
the caller's loss for that step (its batch, its objective: next-token cross-entropy, distillation, a recommender's
sampled or full softmax), backpropagates, clips, steps the optimizer, and hands the step to ``after_step`` (logging,
evaluation, checkpoints, an averaged copy, a stopping rule). ``train()`` (train.py) adds the folder, checkpoints,
resume and several processes; ``train_in_memory`` is the plain loop for an experiment's briefly trained model;
the recall models (experiments/recall.py) and the recommenders (recsys/train.py) call it with their own losses.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from attnlab.config import TrainConfig
from attnlab.data.synthetic import IGNORE


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to lr over warmup_steps, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """Weight decay on matrices only (not norms, biases); embeddings are matrices and decay, as in nanoGPT."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=False)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over the positions that have a target (IGNORE elsewhere), in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE)


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                 weight: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """(1 - weight) * cross-entropy on the data + weight * KL(teacher || student), per target position.

    Forward KL (Hinton et al. 2015) pulls the student's mass onto every token the teacher likes, which is
    what raises a draft's acceptance rate min(1, p/q) in speculative decoding. The teacher's distribution
    is taken at ``temperature``: below 1 it sharpens towards the teacher's argmax, which is all a greedy
    draft is checked against."""
    kl = kl_per_target(logits, teacher_logits, targets, temperature).mean()
    return kl if weight == 1.0 else (1 - weight) * lm_loss(logits, targets) + weight * kl


def kl_per_target(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                  ignore_index: int = IGNORE) -> torch.Tensor:
    """KL(teacher at ``temperature`` || student) at each position that has a target: (N,)."""
    mask = targets != ignore_index
    log_q = F.log_softmax(logits.float(), dim=-1)[mask]  # (N, V) over target positions
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)[mask]
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@torch.no_grad()
def evaluate(model, batches, device, teacher=None) -> dict:
    """Mean held-out loss over all target tokens; accuracy over the positions that have a target; with a
    teacher, how often the two models' most likely next tokens agree (a greedy draft's acceptance rate)."""
    was_training = model.training
    model.eval()
    total_loss, total_tokens, correct, agree = 0.0, 0, 0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits, _ = model(x)
        mask = y != IGNORE
        n = int(mask.sum())
        total_loss += float(lm_loss(logits, y)) * n
        correct += int(((logits.argmax(-1) == y) & mask).sum())
        if teacher is not None:
            agree += int(((logits.argmax(-1) == teacher(x)[0].argmax(-1)) & mask).sum())
        total_tokens += n
    model.train(was_training)
    loss = total_loss / max(1, total_tokens)
    out = {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "val_acc": correct / max(1, total_tokens)}
    if teacher is not None:
        out["teacher_agreement"] = agree / max(1, total_tokens)
    return out


@dataclass(frozen=True)
class StepDone:
    """What ``after_step`` learns of a finished step: its number (counted from 1), the learning rate it used, the
    loss it reported, and the gradient norm before clipping (None where it was not computed)."""
    step: int
    lr: float
    loss: torch.Tensor
    grad_norm: torch.Tensor | None


def fit(model: torch.nn.Module, step_loss: Callable[[int], object], cfg: TrainConfig | None = None, *,
        optimizer=None, lr: Callable[[int], float] | None = None, start: int = 0, steps: int | None = None,
        clip: bool = True, grad_norm: bool = False, amp: bool = False,
        after_step: Callable[[StepDone], bool | None] | None = None):
    """Train ``model`` in place from step ``start`` up to ``steps``; returns the model.

    ``step_loss(step)`` (0-based) -> the loss to backpropagate, or (that, the figure to report) where they differ
    (several processes report the global batch's mean). ``cfg`` supplies the defaults: the optimizer
    (make_optimizer), the learning rate at each step (lr_at), the number of steps and the gradient clipping
    (cfg.grad_clip, with ``clip``); without it, give ``optimizer`` and ``lr(step)``, and ``steps`` or an
    ``after_step`` that ends training. ``grad_norm``: compute the norm for ``after_step`` even when not clipping.
    ``amp``: the loss under bf16 autocast (weights and the optimizer stay fp32), for a CPU with bf16 matrix units
    or a GPU. ``after_step(StepDone)`` returning True ends training after that step."""
    if cfg is None and (optimizer is None or lr is None):
        raise TypeError("fit needs a TrainConfig, or both an optimizer and a learning-rate schedule")
    optimizer = optimizer or make_optimizer(model, cfg)
    schedule = lr or (lambda s: lr_at(s, cfg))
    last = steps if steps is not None else (cfg.steps if cfg is not None else None)
    if last is None and after_step is None:
        raise TypeError("fit without a number of steps needs an after_step that ends training")
    clip_to = cfg.grad_clip if clip and cfg is not None else 0.0
    params = [p for p in model.parameters() if p.requires_grad]
    device_type = params[0].device.type if params else "cpu"
    model.train()
    step = start
    while last is None or step < last:
        rate = schedule(step)
        for group in optimizer.param_groups:
            group["lr"] = rate
        with torch.autocast(device_type, dtype=torch.bfloat16) if amp else contextlib.nullcontext():
            got = step_loss(step)
        loss, reported = got if isinstance(got, tuple) else (got, got)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = None
        if clip_to or grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_to or float("inf"))
        optimizer.step()
        step += 1
        if after_step is not None and after_step(StepDone(step, rate, reported, norm)):
            break
    return model


def train_in_memory(model, batch, cfg: TrainConfig, clip: bool = True, teacher=None, amp: bool = False, until=None):
    """``fit`` without files, for experiments that need a briefly trained model and no checkpoint; returns it in
    eval mode. ``batch(step) -> (x, y)``. With ``teacher`` (a frozen model of the same vocabulary) the loss is
    distill_loss at cfg.distill_weight / cfg.distill_temperature; a batch of three, (x, y, teacher_logits), distils
    from logits computed beforehand (a teacher run once over a fixed sample set rather than at every step).
    ``amp``: see fit. ``until(steps_done) -> bool``, called after every step, ends training early when it returns
    True (a curriculum phase that lasts until a skill is learned)."""
    def step_loss(step: int) -> torch.Tensor:
        x, y, *given = batch(step)
        logits = model(x)[0]
        if teacher is None and not given:
            return lm_loss(logits, y)
        if not given:
            with torch.no_grad():
                given = [teacher(x)[0]]
        return distill_loss(logits, given[0], y, cfg.distill_weight, cfg.distill_temperature)

    fit(model, step_loss, cfg, clip=clip, amp=amp, after_step=None if until is None else lambda d: until(d.step))
    return model.eval()

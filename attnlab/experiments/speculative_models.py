"""Claim 13's models: the target, grown from a trained narrow model, and the drafts distilled from it.

The target is trained narrow (a third of its width, a ninth of its training cost per token), grown to full width
(Net2WiderNet: the same function) and trained on: a model with the full target's weight traffic per decoded token
that has learned the corpus, for a fraction of training the full width from scratch (claim 13's CHANGES,
2026-12-03). It is trained in the report's training stage (training.py), one job on one thread beside the other
claims' models; the drafts are distilled from its own greedy continuations inside the claim.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tasks import make_task
from attnlab.engine.quantize import set_precision
from attnlab.errors import ConfigError
from attnlab.experiments.training import LONG, Job, run_tasks, workers_for
from attnlab.models import build_model
from attnlab.models.grow import grow_width
from attnlab.runtime import bf16_trains_faster
from attnlab.fit import evaluate, lm_loss, train_in_memory

GROW_STEPS, GROWN_STEPS, NARROW_LR, GROWN_LR, GROW_NOISE = 400, 30, 2e-3, 3e-4, 0.01


def narrow_config(s: dict) -> ModelConfig:
    """The model trained first, grown s["grow"] times wider into the target (models/grow.py)."""
    t, g = s["target"], s["grow"]
    if t.dim % g or t.n_heads % g or t.n_kv_heads % g or t.hidden_dim % g:
        raise ConfigError(f"grow={g} must divide the target's dim, heads, key/value heads and MLP width "
                          f"({t.dim}, {t.n_heads}, {t.n_kv_heads}, {t.hidden_dim})")
    return replace(t, dim=t.dim // g, n_heads=t.n_heads // g, n_kv_heads=t.n_kv_heads // g, head_dim=t.head_dim,
                   hidden_dim=t.hidden_dim // g)


def train_config(s: dict) -> TrainConfig:
    """The narrow model's training (the grown one continues it at GROWN_LR); its data is the corpus task's."""
    return TrainConfig(seq_len=s["seq_len"], batch_size=s["batch"], steps=s["steps"], lr=NARROW_LR,
                       warmup_steps=s["steps"] // 10, corpus_max_bytes=3_000_000)


def _target_job(s: dict, device: str, amp: bool) -> dict:
    """Train the narrow model, grow it into the target, train that briefly, as the training stage runs it:
    {"weights" (plain tensors), "narrow_loss", "val_loss" (held-out, nats/byte), "phase_s"}."""
    t0 = time.perf_counter()
    tc = train_config(s)
    task = make_task(tc)
    batch = lambda step: tuple(t.to(device) for t in task.batch(step))
    torch.manual_seed(0)
    narrow = train_in_memory(build_model(narrow_config(s), device), batch, tc, amp=amp)
    narrow_loss = evaluate(narrow, task.eval_batches(), device)["val_loss"]
    t1 = time.perf_counter()
    grown = grow_width(narrow, s["grow"], noise=GROW_NOISE)
    assert grown.cfg == s["target"], (grown.cfg, s["target"])
    gc = replace(tc, steps=s["grown_steps"], lr=GROWN_LR, warmup_steps=max(1, s["grown_steps"] // 10))
    target = train_in_memory(grown, lambda step: batch(s["steps"] + step), gc, amp=amp)  # batches not drawn before
    val_loss = evaluate(target, task.eval_batches(), device)["val_loss"]
    return {"weights": {k: v.detach().clone() for k, v in target.state_dict().items()}, "narrow_loss": narrow_loss,
            "val_loss": val_loss, "phase_s": {"train narrow model": t1 - t0,
                                              "fine-tune grown target": time.perf_counter() - t1}}


def _narrow_step(s: dict, device: str):
    """step(amp): one forward and backward of a fresh narrow model on a training batch, what most of the target's
    training time goes to (runtime.bf16_trains_faster times it both ways). Built under its own random state, so
    the caller's draws do not depend on whether this ran."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(narrow_config(s), device)
    x, y = (t.to(device) for t in make_task(train_config(s)).batch(0))

    def step(amp: bool) -> None:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp):
            loss = lm_loss(model(x)[0], y)
        loss.backward()
        model.zero_grad(set_to_none=True)
    return step


_CACHE: dict = {}  # (scale, device) -> what target() returns


def _target_task(s: dict, key: tuple, device: str):
    amp = bf16_trains_faster(device, make_step=lambda: _narrow_step(s, device))
    out, = yield [Job(_target_job, (s, str(device), amp), LONG)]
    model = build_model(s["target"], device)
    model.load_state_dict(out["weights"])
    tc = train_config(s)
    _CACHE[key] = {"model": model.eval(), "task": make_task(tc), "train_config": tc, "amp": amp,
                   **{k: v for k, v in out.items() if k != "weights"}}


def target_tasks(s: dict, scale: str, device: str) -> dict:
    """The target's training, for the report's training stage, unless it is trained already."""
    key = (scale, str(device))
    return {} if key in _CACHE else {("speculative target",) + key: _target_task(s, key, device)}


def target(s: dict, scale: str, device: str) -> dict:
    """The trained target (by the training stage, or here when claim 13 runs alone): {"model", "task" (its corpus),
    "train_config", "amp" (bf16 autocast used), "narrow_loss", "val_loss", "phase_s"}."""
    run_tasks(target_tasks(s, scale, device).values(), workers_for(device))
    return _CACHE[(scale, str(device))]


def teacher_logits(model, samples: torch.Tensor, amp: bool, chunk: int = 16) -> torch.Tensor:
    """The target's next-token logits over every sample (kept in bf16, computed once): what the drafts are
    distilled to."""
    with torch.inference_mode(), torch.autocast(samples.device.type, dtype=torch.bfloat16, enabled=amp):
        return torch.cat([model(samples[i:i + chunk, :-1])[0].to(torch.bfloat16)
                          for i in range(0, len(samples), chunk)])


def train_drafts(s: dict, tc: TrainConfig, samples: torch.Tensor, logits: torch.Tensor, device) -> dict:
    """Each draft of s["drafts"] distilled to the target's logits over whole sample sequences, 16 at a time."""
    def batch(step):
        idx = torch.randint(0, len(samples), (16,), generator=torch.Generator().manual_seed(step))
        return samples[idx, :-1], samples[idx, 1:], logits[idx]

    dtc = TrainConfig(seq_len=samples.shape[1] - 1, batch_size=16, steps=s["draft_steps"], lr=3e-3,
                      warmup_steps=s["draft_steps"] // 10, corpus_max_bytes=tc.corpus_max_bytes)
    drafts = {}
    for name, cfg in s["drafts"].items():
        torch.manual_seed(0)
        drafts[name] = set_precision(train_in_memory(build_model(cfg, device), batch, dtc), "fp32")
    return drafts


def expected_acceptance(target, draft, seqs: list[list[int]], prompt_len: int, temperature: float) -> float:
    """Teacher-forced on the target's continuations: the mean over positions of sum_v min(p_v, q_v), the chance that
    speculative sampling accepts the draft's token (Leviathan et al. 2023, alpha), with p the target's and q the
    draft's next-token distribution at ``temperature`` (0: greedy, where it is how often their argmaxes agree)."""
    device = next(draft.parameters()).device
    total, n = 0.0, 0
    with torch.inference_mode():
        for seq in seqs:
            ids = torch.tensor([seq[:-1]], device=device)
            p, q = (m(ids)[0][0, prompt_len - 1:].float() for m in (target, draft))  # (new, V)
            if temperature == 0:
                total += float((p.argmax(-1) == q.argmax(-1)).sum())
            else:
                total += float(torch.minimum((p / temperature).softmax(-1), (q / temperature).softmax(-1)).sum())
            n += len(seq) - prompt_len
    return total / max(1, n)

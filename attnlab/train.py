"""One ``train()`` function: AdamW, warmup + cosine, clipping, held-out evaluation, checkpoints, resume.

Exact resume: batch s is a pure function of (seed, s); the checkpoint holds the weights, AdamW's
moments and step counts, and the RNG states, all as safetensors. A run killed at any moment and
restarted with ``resume=True`` therefore ends with the same weights, bit for bit, as one never
interrupted (on the same machine, threads and torch version). metrics.jsonl is cut back to the
checkpoint's step on resume, so the loss curve is the uninterrupted one as well.

A run holds an exclusive lock on its folder from start to end (folder_lock.py), and a folder that holds a
checkpoint is only continued (``resume``) or, when asked explicitly, replaced (``overwrite``).

Several processes (torchrun, or ``attnlab train --nproc``): the model is built once per rank, loaded on
resume, and wrapped in one place (``distributed.parallelize``); each rank trains on its share of every
global batch (``distributed.parallel.Split``); rank 0 alone locks the folder, logs and writes checkpoints,
which hold the whole weights and optimizer state, so a run resumes with any number of processes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.checkpoint import (CONFIG, MANIFEST, TRAINER, WEIGHTS, has_checkpoint, load_trainer_state, load_weights,
                                save_checkpoint)
from attnlab.config import ModelConfig, RunConfig, TrainConfig
from attnlab.data.synthetic import IGNORE
from attnlab.data.tasks import make_task
from attnlab.distributed.parallel import (Split, check, full_optimizer_state, full_weights, parallelize, place_like,
                                          unwrap)
from attnlab.errors import CheckpointError, ConfigError, TrainingDiverged
from attnlab.folder_lock import FolderLock
from attnlab.models import build_model, count_params
from attnlab.runtime import resolve_device

METRICS = "metrics.jsonl"
# Changing these on resume cannot change the weights: they only say when to log, evaluate or save.
RESUME_MAY_DIFFER = {"log_every", "eval_every", "save_every", "eval_batches", "steps"}


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
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE)


def distill_loss(logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                 weight: float = 1.0, temperature: float = 1.0) -> torch.Tensor:
    """(1 - weight) * cross-entropy on the data + weight * KL(teacher || student), per target position.

    Forward KL (Hinton et al. 2015) pulls the student's mass onto every token the teacher likes, which is
    what raises a draft's acceptance rate min(1, p/q) in speculative decoding. The teacher's distribution
    is taken at ``temperature``: below 1 it sharpens towards the teacher's argmax, which is all a greedy
    draft is checked against."""
    mask = targets != IGNORE
    log_q = F.log_softmax(logits.float(), dim=-1)[mask]  # (N, V) over target positions
    log_p = F.log_softmax(teacher_logits.float() / temperature, dim=-1)[mask]
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return kl if weight == 1.0 else (1 - weight) * lm_loss(logits, targets) + weight * kl


def load_teacher(path: str, task, device) -> torch.nn.Module:
    """The frozen model to imitate; its vocabulary (and tokenizer, for text) must be the student's."""
    from attnlab.loading import load_any

    teacher = load_any(path, device=str(device))
    vocab = teacher.model.cfg.vocab_size
    if vocab != task.vocab_size:
        raise ConfigError(f"--distill-from {path}: the teacher's vocabulary ({vocab}) differs from this run's "
                          f"({task.vocab_size}); train with the teacher's tokenizer")
    if not task.synthetic and teacher.tokenizer is not None:
        probe = "def f(x):\n    return x  # é"
        if teacher.tokenizer.encode(probe) != task.tokenizer.encode(probe):
            raise ConfigError(f"--distill-from {path}: the teacher's tokenizer ({teacher.tokenizer.name}) splits text "
                              f"differently from this run's ({task.tokenizer.name}); use the same tokenizer")
    model = teacher.model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


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


def train_in_memory(model, batch, cfg: TrainConfig, clip: bool = True, teacher=None, amp: bool = False, until=None):
    """The plain loop without files: AdamW, the warmup + cosine schedule, clipping. ``batch(step) -> (x, y)``.
    For experiments that need a briefly trained model and no checkpoint. With ``teacher`` (a frozen model of
    the same vocabulary) the loss is distill_loss at cfg.distill_weight / cfg.distill_temperature; a batch of
    three, (x, y, teacher_logits), distils from logits computed beforehand (a teacher run once over a fixed
    sample set rather than at every step). ``amp``: forward and backward under bf16 autocast (weights and the
    optimizer stay fp32), for a CPU with bf16 matrix units or a GPU. ``until(steps_done) -> bool``, called after
    every step, ends training early when it returns True (a curriculum phase that lasts until a skill is learned)."""
    optimizer = make_optimizer(model, cfg)
    model.train()
    device_type = next(model.parameters()).device.type
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y, *given = batch(step)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)[0]
            if teacher is None and not given:
                loss = lm_loss(logits, y)
            else:
                if not given:
                    with torch.no_grad():
                        given = [teacher(x)[0]]
                loss = distill_loss(logits, given[0], y, cfg.distill_weight, cfg.distill_temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip and cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        if until is not None and until(step + 1):
            break
    return model.eval()


def _trainer_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    """RNG states and AdamW's state by parameter name, whole (gathered from every rank when sharded)."""
    out = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["rng/cuda"] = torch.cuda.get_rng_state()
    out.update(full_optimizer_state(model, optimizer))
    return out


def _restore_trainer(model, optimizer, tensors) -> None:
    params = dict(unwrap(model).named_parameters())
    for key, val in tensors.items():
        kind, rest = key.split("/", 1)
        if kind == "rng":
            if rest == "torch":
                torch.set_rng_state(val)
            elif rest == "cuda" and torch.cuda.is_available():
                torch.cuda.set_rng_state(val)
            continue
        name, slot = rest.rsplit("/", 1)
        if name not in params:
            raise CheckpointError(f"trainer state names parameter {name!r}, which the model lacks")
        p = params[name]
        optimizer.state[p][slot] = place_like(val, p) if slot != "step" else val  # this rank's shard if sharded


def _check_resume_config(saved: RunConfig, model_cfg: ModelConfig, train_cfg: TrainConfig, folder: Path) -> None:
    diffs = [f"model.{k}: saved {v!r}, now {getattr(model_cfg, k)!r}"
             for k, v in saved.model.to_dict().items() if getattr(model_cfg, k) != v]
    if saved.train is not None:
        diffs += [f"train.{k}: saved {v!r}, now {getattr(train_cfg, k)!r}"
                  for k, v in saved.train.to_dict().items()
                  if k not in RESUME_MAY_DIFFER and getattr(train_cfg, k) != v]
    if diffs:
        raise ConfigError(f"--resume in {folder}: the command differs from the saved run ({'; '.join(diffs)}); "
                          "rerun with the same settings, or use a new --out")


def _cut_metrics(path: Path, step: int) -> None:
    """Keep only complete lines up to ``step``: a killed run may have logged past its last checkpoint."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
        if rec.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    tmp.replace(path)


def _discard_checkpoint(out: Path) -> None:
    """--overwrite: remove the old run's files, the manifest first, so that the folder stops being a checkpoint
    at once and a new run killed before its first save cannot leave the old weights beside its own metrics."""
    for name in (MANIFEST, CONFIG, WEIGHTS, TRAINER, METRICS, "tokenizer.json"):
        (out / name).unlink(missing_ok=True)


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, out_dir: str | Path, resume: bool = False,
          overwrite: bool = False, progress: bool = True, stop_after: int | None = None, parallel=None) -> dict:
    """Train and checkpoint into ``out_dir``; returns a summary with the final metrics and timings.

    The folder is locked for the whole call: another run into it is refused with its pid (FolderInUse); a lock
    left by a killed run is taken over and its pid returned as ``stale_lock_pid``. ``stop_after`` ends this
    call after that step (checkpointing it) without changing the schedule, so a long run can be done in slices
    with ``resume=True``.

    Inside torchrun or ``attnlab train --nproc`` the process group is joined here and left at the end;
    ``parallel`` (distributed.ParallelConfig) says how the ranks share the work."""
    import torch.distributed as dist

    from attnlab.distributed.group import destroy, init_distributed
    from attnlab.distributed.parallel import ParallelConfig

    parallel = parallel or ParallelConfig()
    owned = not dist.is_initialized()
    ctx = init_distributed(train_cfg.device, parallel.timeout_s)
    try:
        if not ctx.is_main:  # rank 0 holds the folder's lock for the whole group
            return _train_locked(model_cfg, train_cfg, Path(out_dir), resume, overwrite, False, stop_after, ctx,
                                 parallel)
        with FolderLock(out_dir) as lock:
            summary = _train_locked(model_cfg, train_cfg, Path(out_dir), resume, overwrite, progress, stop_after, ctx,
                                    parallel)
    finally:
        if owned:
            destroy()
    if lock.stale_pid is not None:
        summary["stale_lock_pid"] = lock.stale_pid
    return summary


def _train_locked(model_cfg: ModelConfig, train_cfg: TrainConfig, out: Path, resume: bool, overwrite: bool,
                  progress: bool, stop_after: int | None, ctx, parallel) -> dict:
    if ctx.is_main:  # the other ranks trust rank 0's checks of the folder (and wait for them below)
        if resume and overwrite:
            raise ConfigError("--resume continues the checkpoint in --out and --overwrite replaces it: choose one")
        if has_checkpoint(out) and not (resume or overwrite):
            raise CheckpointError(f"{out} already holds a checkpoint; pass --resume to continue it, --overwrite to "
                                  "replace it, or choose another --out (nothing was overwritten)")
        if resume and has_checkpoint(out) and not (out / TRAINER).exists():
            raise CheckpointError(f"{out} holds a checkpoint without {TRAINER}, so it cannot be resumed; pass "
                                  "--overwrite to replace it, or choose another --out (nothing was overwritten)")
    device = torch.device(ctx.device) if ctx.distributed else resolve_device(train_cfg.device)
    torch.manual_seed(train_cfg.seed)
    task = make_task(train_cfg, out, resume=resume)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=task.vocab_size)
    if not model_cfg.is_recurrent and model_cfg.pos == "learned" and train_cfg.seq_len > model_cfg.max_seq_len:
        raise ConfigError(f"seq_len={train_cfg.seq_len} is above the learned positional table's size "
                          f"max_seq_len={model_cfg.max_seq_len}; raise --max-seq-len or shorten --seq-len")
    if ctx.distributed:
        check(ctx, parallel, model_cfg, train_cfg)
        if train_cfg.distill_from:
            raise ConfigError("--distill-from runs in one process for now; drop --nproc (or torchrun)")
    model = build_model(model_cfg, device)
    teacher = load_teacher(train_cfg.distill_from, task, device) if train_cfg.distill_from else None
    run_cfg = RunConfig(model=model_cfg, train=train_cfg, tokenizer="byte" if task.synthetic else task.tokenizer.name,
                        extra={"data": task.info, "torch": torch.__version__, "params": count_params(model)})
    start, tensors = 0, None
    metrics_path = out / METRICS
    resuming = resume and has_checkpoint(out)
    if ctx.is_main and not resuming:
        if overwrite:
            _discard_checkpoint(out)
        metrics_path.unlink(missing_ok=True)
    if ctx.distributed:
        torch.distributed.barrier()  # rank 0 has checked (and, with --overwrite, cleared) the folder
    if resuming:
        from attnlab.checkpoint import verify
        from safetensors.torch import load_file

        verify(out)
        _check_resume_config(RunConfig.load(out / "config.json"), model_cfg, train_cfg, out)
        load_weights(model, {k: v.to(device) for k, v in load_file(str(out / "model.safetensors")).items()},
                     str(out / "model.safetensors"))
        tensors, start, _ = load_trainer_state(out)
    model = parallelize(model, ctx, parallel)  # the one place the model is made parallel (a no-op in one process)
    optimizer = make_optimizer(model, train_cfg)
    if resuming:
        _restore_trainer(model, optimizer, tensors)
        if ctx.is_main:
            _cut_metrics(metrics_path, start)
    if task.tokenizer is not None and ctx.is_main:
        task.tokenizer.save(out)
    eval_batches = task.eval_batches()
    split = Split(ctx, parallel, IGNORE)
    model.train()
    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len
    summary = {"params": count_params(unwrap(model)), "start_step": start, "steps": train_cfg.steps, "out": str(out),
               "world_size": ctx.world_size}
    last_good = start
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=train_cfg.steps, initial=start, desc=f"train {model_cfg.family}", unit="step",
                   dynamic_ncols=True)
    t_start, window_t, window_tokens = time.perf_counter(), time.perf_counter(), 0
    with (open(metrics_path, "a") if ctx.is_main else contextlib.nullcontext()) as log:
        for step in range(start, train_cfg.steps):
            lr = lr_at(step, train_cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = task.batch(step)
            if ctx.distributed:  # this rank's rows (or positions) of the global batch; the global mean loss
                x, y, state = split.local(x, y)
                logits, _ = model(x.to(device), state=state)
                loss, batch_loss = split.loss(logits, y.to(device))
            else:
                logits, _ = model(x.to(device))
                if teacher is None:
                    loss = lm_loss(logits, y.to(device))
                else:
                    with torch.no_grad():
                        teacher_logits, _ = teacher(x.to(device))
                    loss = distill_loss(logits, teacher_logits, y.to(device), train_cfg.distill_weight,
                                        train_cfg.distill_temperature)
                batch_loss = loss
            if not torch.isfinite(batch_loss):
                raise TrainingDiverged(
                    f"loss became {batch_loss.item()} at step {step + 1}; stopped, and the last good checkpoint "
                    f"(step {last_good}) is kept in {out}; lower --lr or keep gradient clipping on")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip or float("inf"))
            optimizer.step()
            done = step + 1
            window_tokens += tokens_per_step
            if done % train_cfg.log_every == 0 or done == train_cfg.steps:
                now = time.perf_counter()
                rec = {"step": done, "loss": batch_loss.item(), "lr": lr, "grad_norm": _item(grad_norm),
                       "tok_per_s": window_tokens / (now - window_t), "elapsed_s": now - t_start}
                window_t, window_tokens = now, 0
                if log is not None:
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                summary["loss"], summary["tok_per_s"] = rec["loss"], rec["tok_per_s"]
                if bar is not None:
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tok_per_s']:.0f}")
            if (done % train_cfg.eval_every == 0 or done == train_cfg.steps) and (ctx.is_main or parallel.shard):
                # sharded weights are gathered layer by layer, so every rank evaluates; otherwise rank 0 alone
                ev = evaluate(model if parallel.shard else unwrap(model), eval_batches, device, teacher)
                if log is not None:
                    log.write(json.dumps({"step": done, **ev}) + "\n")
                    log.flush()
                summary.update(ev)
            stopping = done == stop_after
            if (train_cfg.save_every and done % train_cfg.save_every == 0) or done == train_cfg.steps or stopping:
                weights = full_weights(model) if ctx.distributed else None  # every rank: a collective when sharded
                trainer = _trainer_tensors(model, optimizer)
                if ctx.is_main:
                    save_checkpoint(out, unwrap(model), run_cfg, done, trainer, weights=weights)
                last_good = done
            if bar is not None:
                bar.update(1)
            if stopping:
                break
    if bar is not None:
        bar.close()
    summary["train_s"] = time.perf_counter() - t_start
    summary["final_step"] = last_good
    return summary


def _item(t) -> float:
    """A scalar tensor's value (a DTensor's, under FSDP2, is gathered first)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).item()

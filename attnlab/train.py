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
import time
from pathlib import Path

import torch

from attnlab.checkpoint import (CONFIG, MANIFEST, TRAINER, WEIGHTS, has_checkpoint, load_trainer_state,
                                save_checkpoint)
from attnlab.config import ModelConfig, RunConfig, TrainConfig
from attnlab.data.synthetic import IGNORE
from attnlab.data.tasks import make_task
from attnlab.distributed.parallel import (Split, check, full_optimizer_state, full_weights, parallelize, place_like,
                                          unwrap)
from attnlab.errors import CheckpointError, ConfigError, TrainingDiverged
from attnlab.fit import StepDone, distill_loss, evaluate, fit, lm_loss, make_optimizer
from attnlab.folder_lock import FolderLock
from attnlab.models import build_model, count_params
from attnlab.models.weights import load_weights
from attnlab.runtime import resolve_device

METRICS = "metrics.jsonl"
# Changing these on resume cannot change the weights: they only say when to log, evaluate or save.
RESUME_MAY_DIFFER = {"log_every", "eval_every", "save_every", "eval_batches", "steps"}


def load_teacher(path: str, task, device) -> torch.nn.Module:
    """The frozen model to imitate; its vocabulary (and tokenizer, for text) must be the student's."""
    from attnlab.resolve import load_model

    teacher = load_model(path, device=str(device))
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


def _trainer_tensors(model, optimizer) -> dict[str, torch.Tensor]:
    """RNG states and AdamW's state by parameter name, whole (gathered from every rank when sharded)."""
    out = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["rng/cuda"] = torch.cuda.get_rng_state()
    out.update(full_optimizer_state(model, optimizer))
    return out


def _restore_trainer(model, optimizer, tensors) -> None:
    inner = unwrap(model)
    params = dict(inner.named_parameters())
    for key, val in tensors.items():
        kind, rest = key.split("/", 1)
        if kind == "rng":
            if rest == "torch":
                torch.set_rng_state(val)
            elif rest == "cuda" and torch.cuda.is_available():
                torch.cuda.set_rng_state(val)
            continue
        name, slot = rest.rsplit("/", 1)
        name = next(iter(inner.upgrade_state_dict({name: None})))  # older parameter names, as the weights'
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


def _check_folder(out: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a run that would lose a checkpoint or cannot continue one (rank 0's checks; the others wait)."""
    if resume and overwrite:
        raise ConfigError("--resume continues the checkpoint in --out and --overwrite replaces it: choose one")
    if has_checkpoint(out) and not (resume or overwrite):
        raise CheckpointError(f"{out} already holds a checkpoint; pass --resume to continue it, --overwrite to "
                              "replace it, or choose another --out (nothing was overwritten)")
    if resume and has_checkpoint(out) and not (out / TRAINER).exists():
        raise CheckpointError(f"{out} holds a checkpoint without {TRAINER}, so it cannot be resumed; pass "
                              "--overwrite to replace it, or choose another --out (nothing was overwritten)")


def _check_teacher(teacher, ctx, parallel) -> None:
    """Refuse a teacher that cannot run on this rank's share of a sequence-parallel batch."""
    if teacher is not None and ctx.distributed and parallel.seq_parallel > 1:
        t = teacher.cfg
        if t.family != "transformer" or t.pos == "alibi" or t.kernel in ("sliding", "block_sparse"):
            raise ConfigError(f"--distill-from with --seq-parallel runs the teacher on the same shards by ring "
                              f"attention: it needs a softmax transformer without ALiBi (the teacher is a "
                              f"{t.family} with {t.pos} positions and the {t.kernel} kernel); drop --seq-parallel")


def _train_locked(model_cfg: ModelConfig, train_cfg: TrainConfig, out: Path, resume: bool, overwrite: bool,
                  progress: bool, stop_after: int | None, ctx, parallel) -> dict:
    if ctx.is_main:  # the other ranks trust rank 0's checks of the folder (and wait for them below)
        _check_folder(out, resume, overwrite)
    device = torch.device(ctx.device) if ctx.distributed else resolve_device(train_cfg.device)
    torch.manual_seed(train_cfg.seed)
    task = make_task(train_cfg, out, resume=resume)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=task.vocab_size)
    if not model_cfg.is_recurrent and model_cfg.pos == "learned" and train_cfg.seq_len > model_cfg.max_seq_len:
        raise ConfigError(f"seq_len={train_cfg.seq_len} is above the learned positional table's size "
                          f"max_seq_len={model_cfg.max_seq_len}; raise --max-seq-len or shorten --seq-len")
    if ctx.distributed:
        check(ctx, parallel, model_cfg, train_cfg)
    model = build_model(model_cfg, device)
    teacher = load_teacher(train_cfg.distill_from, task, device) if train_cfg.distill_from else None
    _check_teacher(teacher, ctx, parallel)
    run_cfg = RunConfig(model=model_cfg, train=train_cfg, tokenizer="byte" if task.synthetic else task.tokenizer.name,
                        extra={"data": task.info, "torch": torch.__version__, "params": count_params(model)})
    start, tensors = 0, None
    resuming = resume and has_checkpoint(out)
    if ctx.is_main and not resuming:
        if overwrite:
            _discard_checkpoint(out)
        (out / METRICS).unlink(missing_ok=True)
    if ctx.distributed:
        torch.distributed.barrier()  # rank 0 has checked (and, with --overwrite, cleared) the folder
    if resuming:
        from attnlab.checkpoint import verify
        from safetensors.torch import load_file

        verify(out)
        _check_resume_config(RunConfig.load(out / "config.json"), model_cfg, train_cfg, out)
        saved = model.upgrade_state_dict(load_file(str(out / WEIGHTS)))  # older weight names, as every loader
        load_weights(model, {k: v.to(device) for k, v in saved.items()}, str(out / WEIGHTS))
        tensors, start, _ = load_trainer_state(out)
    model = parallelize(model, ctx, parallel)  # the one place the model is made parallel (a no-op in one process)
    optimizer = make_optimizer(model, train_cfg)
    if resuming:
        _restore_trainer(model, optimizer, tensors)
        if ctx.is_main:
            _cut_metrics(out / METRICS, start)
    if task.tokenizer is not None and ctx.is_main:
        task.tokenizer.save(out)
    run = _Run(model, teacher, optimizer, task, train_cfg, run_cfg, out, device, ctx, parallel, start, stop_after)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=train_cfg.steps, initial=start, desc=f"train {model_cfg.family}", unit="step",
                   dynamic_ncols=True)
    with (open(out / METRICS, "a") if ctx.is_main else contextlib.nullcontext()) as log:
        run.log, run.bar = log, bar
        fit(model, run.step_loss, train_cfg, optimizer=optimizer, start=start, grad_norm=True,
            after_step=run.after_step)
    if bar is not None:
        bar.close()
    run.summary["train_s"] = time.perf_counter() - run.t_start
    run.summary["final_step"] = run.last_good
    return run.summary


class _Run:
    """One rank's run into a folder, as ``fit`` sees it: the loss of each step on this rank's share of the batch, and
    after each step the log, the evaluation and the checkpoint on their schedules."""

    def __init__(self, model, teacher, optimizer, task, cfg: TrainConfig, run_cfg: RunConfig, out: Path, device, ctx,
                 parallel, start: int, stop_after: int | None):
        self.model, self.teacher, self.optimizer, self.task, self.cfg = model, teacher, optimizer, task, cfg
        self.run_cfg, self.out, self.device, self.ctx, self.parallel = run_cfg, out, device, ctx, parallel
        self.stop_after, self.last_good = stop_after, start
        self.split = Split(ctx, parallel, IGNORE)
        self.eval_batches = task.eval_batches()
        self.summary = {"params": count_params(unwrap(model)), "start_step": start, "steps": cfg.steps,
                        "out": str(out), "world_size": ctx.world_size}
        self.log = self.bar = None
        self.t_start = self.window_t = time.perf_counter()
        self.window_tokens = 0

    def step_loss(self, step: int):
        """This rank's loss on its share of global batch ``step``, and the global batch's mean (for the log)."""
        cfg = self.cfg
        x, y = self.task.batch(step)
        x, y, state = self.split.local(x, y)  # this rank's rows or positions (all of them in one process)
        x, y = x.to(self.device), y.to(self.device)
        logits, _ = self.model(x, state=state)
        teacher_logits = None
        if self.teacher is not None:
            with torch.no_grad():
                teacher_logits, _ = self.teacher(x, state=state)
        if self.ctx.distributed:
            loss, batch_loss = self.split.loss(logits, y, teacher_logits, cfg.distill_weight, cfg.distill_temperature)
        elif teacher_logits is None:
            loss = batch_loss = lm_loss(logits, y)
        else:
            loss = batch_loss = distill_loss(logits, teacher_logits, y, cfg.distill_weight, cfg.distill_temperature)
        if not torch.isfinite(batch_loss):
            raise TrainingDiverged(
                f"loss became {batch_loss.item()} at step {step + 1}; stopped, and the last good checkpoint "
                f"(step {self.last_good}) is kept in {self.out}; lower --lr or keep gradient clipping on")
        return loss, batch_loss

    def after_step(self, d: StepDone) -> bool:
        """Log, evaluate and save on their schedules; True (stop) at ``stop_after``."""
        cfg, done = self.cfg, d.step
        self.window_tokens += cfg.batch_size * cfg.seq_len
        if done % cfg.log_every == 0 or done == cfg.steps:
            now = time.perf_counter()
            rec = {"step": done, "loss": d.loss.item(), "lr": d.lr, "grad_norm": _item(d.grad_norm),
                   "tok_per_s": self.window_tokens / (now - self.window_t), "elapsed_s": now - self.t_start}
            self.window_t, self.window_tokens = now, 0
            self._write(rec)
            self.summary["loss"], self.summary["tok_per_s"] = rec["loss"], rec["tok_per_s"]
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tok_per_s']:.0f}")
        shard = self.parallel.shard
        if (done % cfg.eval_every == 0 or done == cfg.steps) and (self.ctx.is_main or shard):
            # sharded weights are gathered layer by layer, so every rank evaluates; otherwise rank 0 alone
            ev = evaluate(self.model if shard else unwrap(self.model), self.eval_batches, self.device, self.teacher)
            self._write({"step": done, **ev})
            self.summary.update(ev)
        stopping = done == self.stop_after
        if (cfg.save_every and done % cfg.save_every == 0) or done == cfg.steps or stopping:
            weights = full_weights(self.model) if self.ctx.distributed else None  # a collective when sharded
            trainer = _trainer_tensors(self.model, self.optimizer)
            if self.ctx.is_main:
                save_checkpoint(self.out, unwrap(self.model), self.run_cfg, done, trainer, weights=weights)
            self.last_good = done
        if self.bar is not None:
            self.bar.update(1)
        return stopping

    def _write(self, rec: dict) -> None:
        if self.log is not None:
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()


def _item(t) -> float:
    """A scalar tensor's value (a DTensor's, under FSDP2, is gathered first)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).item()

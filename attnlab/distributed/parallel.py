"""The one place a built model is made parallel, and what training needs around it.

``parallelize(model, ctx, cfg)`` wraps an already built (and, on resume, already loaded) model:

- data parallel (default): ``DistributedDataParallel``; every rank holds the whole model, reads its own
  rows of each global batch, and gradients are averaged in buckets during the backward pass;
- ``shard``: torch's FSDP2 ``fully_shard`` on every block and on the root: parameters, gradients and AdamW's
  moments are split across ranks, gathered layer by layer for compute (runs on gloo/CPU with torch 2.13,
  checked here, and on NCCL);
- ``seq_parallel``: every rank holds the whole model and whole batch rows but only its zig-zag share of the
  positions; attention runs as ring attention (``RingState``) on a process group of its own, and the
  parameter gradients are averaged by DDP as for data parallel.

The loss stays the global batch's mean whatever the split: each rank sums its targets' cross-entropy and
divides by the global target count (one all-reduce of a count per step), times the world size because DDP
averages. So ``--batch-size`` means the same with and without ``--nproc`` and the loss curves agree.
Checkpoints are gathered whole (weights and optimizer state, keyed by parameter name) so that a run written
with P processes resumes with any other number.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlab.distributed.group import DEFAULT_TIMEOUT_S, DistContext
from attnlab.errors import ConfigError


@dataclass
class ParallelConfig:
    """How a run is spread over processes. ``nproc`` is the local launcher's; under torchrun it stays 1."""

    nproc: int = 1
    shard: bool = False  # FSDP2 fully_shard instead of DDP
    seq_parallel: int = 1  # ranks a sequence is split across (ring attention); must equal the world size
    timeout_s: float = DEFAULT_TIMEOUT_S  # every collective; a dead or hung peer becomes an error within it

    def __post_init__(self) -> None:
        for name in ("nproc", "seq_parallel"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s={self.timeout_s} must be > 0")
        if self.shard and self.seq_parallel > 1:
            raise ConfigError("--shard and --seq-parallel cannot be combined yet; choose one")


def check(ctx: DistContext, cfg: ParallelConfig, model_cfg, train_cfg) -> None:
    """Refuse splits that cannot be exact, naming the fix."""
    W = ctx.world_size
    if cfg.seq_parallel > 1:
        if cfg.seq_parallel != W:
            raise ConfigError(f"--seq-parallel {cfg.seq_parallel} needs exactly that many processes, got {W}; "
                              f"run with --nproc {cfg.seq_parallel}")
        if model_cfg.family != "transformer" or model_cfg.pos == "alibi":
            raise ConfigError("--seq-parallel runs ring attention: it needs --family transformer with rope, "
                              "learned, sinusoidal or no positions (not alibi)")
        if model_cfg.kernel in ("sliding", "block_sparse"):
            raise ConfigError(f"--seq-parallel computes full causal attention; kernel {model_cfg.kernel!r} "
                              "has another pattern")
        if model_cfg.dropout:
            raise ConfigError("--seq-parallel: dropout would differ between ranks; use --dropout 0")
    elif train_cfg.batch_size % W:
        raise ConfigError(f"--batch-size {train_cfg.batch_size} is the global batch and must divide evenly over "
                          f"{W} processes; use a multiple of {W}")


def parallelize(model: torch.nn.Module, ctx: DistContext, cfg: ParallelConfig) -> torch.nn.Module:
    """Wrap a built model for this run (unchanged for a single process)."""
    if not ctx.distributed:
        return model
    if cfg.shard:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(torch.device(ctx.device).type, (ctx.world_size,))
        for block in getattr(getattr(model, "backbone", None), "blocks", []):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)  # the root: embeddings, final norm, head (tied weights stay together)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.device(ctx.device).index] if ctx.device.startswith("cuda") else None
    # the model's buffers (rotary tables) are the same on every rank by construction: no per-step sync
    # (torch 2.13 renamed broadcast_buffers to forward_sync_buffers; older torch knows only the first)
    import inspect

    new = "forward_sync_buffers" in inspect.signature(DDP).parameters
    sync = "forward_sync_buffers" if new else "broadcast_buffers"
    return DDP(model, device_ids=ids, **{sync: False})


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model itself (parameter names without DDP's ``module.`` prefix)."""
    return getattr(model, "module", model)


class Split:
    """This rank's share of each global batch, and the loss normalised by the global target count."""

    def __init__(self, ctx: DistContext, cfg: ParallelConfig, ignore_index: int):
        self.ctx, self.cfg, self.ignore = ctx, cfg, ignore_index
        self.ring_group = None
        if ctx.distributed and cfg.seq_parallel > 1:
            self.ring_group = dist.new_group(list(range(ctx.world_size)))  # ring p2p apart from DDP's buckets

    def local(self, x: torch.Tensor, y: torch.Tensor):
        """-> (x, y, state): this rank's rows (data parallel) or positions (sequence parallel)."""
        W, r = self.ctx.world_size, self.ctx.rank
        if not self.ctx.distributed:
            return x, y, None
        if self.ring_group is not None:
            from attnlab.distributed.ring import RingState, shard_sequence

            state = RingState(x.shape[1], self.ring_group)
            return shard_sequence(x, W, r, 1, 0), shard_sequence(y, W, r, 1, self.ignore), state
        rows = x.shape[0] // W
        return x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows], None

    def loss(self, logits: torch.Tensor, y: torch.Tensor, teacher_logits: torch.Tensor | None = None,
             weight: float = 1.0, temperature: float = 1.0):
        """-> (loss to backpropagate, the global batch's mean loss as a float tensor for logging). With
        ``teacher_logits``, the loss is fit.distill_loss's: weight x KL(teacher || student) + (1 - weight) x
        cross-entropy per target position, summed over this rank's targets and divided by the global count, so
        the processes together take the one-process step."""
        from attnlab.fit import kl_per_target

        total = 0.0
        if teacher_logits is None or weight != 1.0:
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                 ignore_index=self.ignore, reduction="sum")
            total = ce if teacher_logits is None else (1 - weight) * ce
        if teacher_logits is not None:
            total = total + weight * kl_per_target(logits, teacher_logits, y, temperature, self.ignore).sum()
        stats = torch.stack([total.detach(), (y != self.ignore).sum().to(total.dtype)])
        dist.all_reduce(stats)
        n = stats[1].clamp(min=1)
        return total * self.ctx.world_size / n, stats[0] / n  # DDP averages gradients: times W: the global mean


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2 shard) gathered whole on every rank; plain tensors as they are."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank, without the tied head's alias (collective under FSDP)."""
    from attnlab.models.weights import unique_state_dict_names

    inner = unwrap(model)
    keep = set(unique_state_dict_names(inner))
    return {n: _full(t).detach().contiguous().cpu() for n, t in inner.state_dict().items() if n in keep}


def full_optimizer_state(model: torch.nn.Module, optimizer) -> dict[str, torch.Tensor]:
    """``optim/<param name>/<slot>`` -> whole tensors, in parameter order (collective under FSDP)."""
    out = {}
    for name, p in unwrap(model).named_parameters():
        for slot, val in optimizer.state.get(p, {}).items():
            out[f"optim/{name}/{slot}"] = _full(val).detach().cpu() if torch.is_tensor(val) else torch.tensor(val)
    return out


def place_like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A whole saved tensor laid out like ``param``: this rank's shard of it under FSDP2."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
    return full.to(param.device)

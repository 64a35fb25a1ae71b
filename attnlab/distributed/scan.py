"""A linear recurrence split across processes: the SSM's scan over a sequence cut into one chunk per rank.

The selective SSM's recurrence h_t = a_t h_{t-1} + b_t (a_t = exp(Delta_t A), b_t = Delta_t B_t u_t; models/ssm.py)
is linear in h, so what a chunk of steps does to the state is an affine map h -> decay * h + end, summarised by
two (B, E, N) tensors: decay = prod_t a_t = exp(A * sum_t Delta_t) and end = the chunk's final state from a zero
start. That summary is what makes the split exact (Blelloch 1990; Martin & Cundy, ICLR 2018), in three phases:

1. every rank scans its own chunk at once, from a zero state (rank 0 from the true h0): outputs y and ``end``;
   every rank but the first also forms what an incoming state will add to each output, the coefficients
   K_t = C_t * prod_{s<=t} a_s = C_t * exp(A * cumsum(Delta)_t), (B, t, E, N): the exps, the costly part, come
   before the exchange, so no rank waits for them after it;
2. the P small summaries are all-gathered and rank r composes those of ranks < r (an exclusive scan, O(P E N)
   work): the state h_in that enters its chunk;
3. every rank r > 0 adds y_t += sum_n K_t h_in, one multiply-add pass over K.

Each rank's y then equals the single-process scan's y at its positions (up to fp32 rounding in another order).
Phase 1 costs rank 0 one scan and the others about two (scan and K), so ``split_lengths`` gives rank 0 a double
share: the critical path is about 2T/(P+1) steps of scan, plus phase 3's pass, against T in one process. Were the
exps of K left until after the exchange, rank 1 would start them only once rank 0 had scanned its whole chunk, and
at 2 processes the critical path would be a full T again. An LSTM has no summary at all (its gates depend
nonlinearly on h_{t-1}): rank r cannot start its exact work before rank r-1 hands over the state.

Forward only (no autograd across ranks). Runs on gloo (CPU) and NCCL (CUDA) alike: one all_gather.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from attnlab.models.ssm_loop import sequential_scan


def split_lengths(T: int, world: int) -> list[int]:
    """Chunk lengths for ``world`` ranks: rank 0 (one scan) a double share, every other rank (two scans) one."""
    if T < world + 1:
        raise ValueError(f"split_lengths: {T} steps cannot give {world} ranks a chunk each (rank 0 a double one)")
    shares = [2] + [1] * (world - 1)
    bounds = [round(T * sum(shares[:i]) / sum(shares)) for i in range(world + 1)]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def chunk_of(x: torch.Tensor, lengths: list[int], rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's chunk of a whole sequence along ``dim`` (the chunks in rank order, as ``split_lengths`` cuts)."""
    return x.narrow(dim, sum(lengths[:rank]), lengths[rank])


def incoming_state(decays: list[torch.Tensor], ends: list[torch.Tensor], rank: int) -> torch.Tensor:
    """The state entering rank ``rank``'s chunk: the composition of the chunks before it, h <- decay_j h + end_j.
    Rank 0's ``end`` already starts from the true h0, so the composition starts from zero."""
    h = torch.zeros_like(ends[0])
    for j in range(rank):
        h = decays[j] * h + ends[j]
    return h


@torch.no_grad()
def scan_split(u, delta, A, Bt, Ct, D, h0, group=None, clock=time.thread_time):
    """This rank's share of ``selective_scan``: u, delta (B, t, E); A (E, N); Bt, Ct (B, t, N); D (E,); h0 (B, E, N),
    the whole sequence's initial state (used by rank 0 only) -> y (B, t, E) and the state after this rank's chunk.

    Returns (y, h_end, phases): phases = {"scan_s", "fix_s"}, ``clock``'s seconds in phase 1 and in phases 2-3 (by
    default this thread's CPU time; on a GPU pass a clock that synchronises first), so a caller can take the critical
    path (max over ranks of each) without counting the collective's wait."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    c0 = clock()
    start = h0 if rank == 0 else torch.zeros_like(h0)
    y, end = sequential_scan(u, delta, A, Bt, Ct, start)  # y (B, t, E) before the D u skip; end (B, E, N)
    decay = torch.exp(delta.sum(1)[..., None] * A)  # (B, E, N): prod_t exp(Delta_t A)
    if rank > 0:  # rank 0 starts from the true state: nothing will be added to its outputs
        K = torch.cumsum(delta, 1)[..., None] * A  # (B, t, E, N): log prod_{s<=t} a_s
        K = K.exp_().mul_(Ct[:, :, None, :])  # C_t * prod a
    c1 = clock()
    parts = [torch.empty((2,) + end.shape, dtype=end.dtype, device=end.device) for _ in range(world)]
    dist.all_gather(parts, torch.stack([decay, end]).contiguous(), group=group)
    c2 = clock()
    h_in = incoming_state([p[0] for p in parts], [p[1] for p in parts], rank)
    if rank > 0:
        y = y + torch.einsum("bten,ben->bte", K, h_in)  # (B, t, E): what the incoming state adds
        end = end + decay * h_in
    c3 = clock()
    return y + D * u, end, {"scan_s": c1 - c0, "fix_s": c3 - c2}

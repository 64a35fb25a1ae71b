"""A linear recurrence split across processes: the SSM's scan over a sequence cut into one chunk per rank.

The selective SSM's recurrence h_t = a_t h_{t-1} + b_t (a_t = exp(Delta_t A), b_t = Delta_t B_t u_t; models/ssm.py)
is linear in h, so what a chunk of steps does to the state is an affine map h -> decay * h + end, summarised by
two (B, E, N) tensors: decay = prod_t a_t = exp(A * sum_t Delta_t) and end = the chunk's final state from a zero
start. That summary is what makes the split exact (Blelloch 1990; Martin & Cundy, ICLR 2018), in three phases:

1. every rank scans its own chunk at once, from a zero state (rank 0 from the true h0): outputs y and ``end``;
2. the P small summaries are all-gathered and rank r composes those of ranks < r (an exclusive scan, O(P E N)
   work): the state h_in that enters its chunk;
3. every rank r > 0 adds what h_in contributes: y_t += C_t . (prod_{s<=t} a_s) h_in, which is the same scan run
   with u = 0 from h_in (about one more scan of the chunk).

Each rank's y then equals the single-process scan's y at its positions (up to fp32 rounding in another order).
The critical path is one scan of a chunk, the exchange, and one correction: about 2T/P steps of scan against T in
one process, so the split pays once P > 2 (a parallel scan does about twice the work; Blelloch 1990). Phase 3
cannot start before rank r-1's chunk is scanned, so unequal chunks do not help: ``split_lengths`` cuts equal ones.
An LSTM has no summary at all (its gates depend nonlinearly on h_{t-1}): rank r cannot start its exact work before
rank r-1 hands over the state, so its chain stays T steps long at any P.

Forward only (no autograd across ranks). Runs on gloo (CPU) and NCCL (CUDA) alike: one all_gather.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from attnlab.models.ssm_loop import sequential_scan


def split_lengths(T: int, world: int) -> list[int]:
    """Equal chunk lengths for ``world`` ranks (the first T % world ranks one longer)."""
    if T < world:
        raise ValueError(f"split_lengths: {T} steps cannot give {world} ranks a chunk each")
    return [T // world + (r < T % world) for r in range(world)]


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
def chunk_scan(u, delta, A, Bt, Ct, start):
    """Phase 1 on one chunk (or on the whole sequence, which is what one process does): y (B, t, E) before the D u
    skip, the state at the chunk's end (B, E, N) and its decay prod_t exp(Delta_t A) (B, E, N)."""
    y, end = sequential_scan(u, delta, A, Bt, Ct, start)
    return y, end, torch.exp(delta.sum(1)[..., None] * A)


@torch.no_grad()
def scan_split(u, delta, A, Bt, Ct, D, h0, group=None, clock=time.thread_time):
    """This rank's share of ``selective_scan``: u, delta (B, t, E); A (E, N); Bt, Ct (B, t, N); D (E,); h0 (B, E, N),
    the whole sequence's initial state (used by rank 0 only) -> y (B, t, E) and the state after this rank's chunk.

    Returns (y, h_end, phases): phases = {"scan_s", "fix_s"}, ``clock``'s seconds in phase 1 and in phases 2-3 (by
    default this thread's CPU time; on a GPU pass a clock that synchronises first), so a caller can take the critical
    path (max over ranks of each) without counting the collective's wait."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    c0 = clock()
    y, end, decay = chunk_scan(u, delta, A, Bt, Ct, h0 if rank == 0 else torch.zeros_like(h0))
    c1 = clock()
    parts = [torch.empty((2,) + end.shape, dtype=end.dtype, device=end.device) for _ in range(world)]
    dist.all_gather(parts, torch.stack([decay, end]).contiguous(), group=group)
    c2 = clock()
    h_in = incoming_state([p[0] for p in parts], [p[1] for p in parts], rank)
    if rank > 0:  # rank 0 started from the true state: nothing to add
        fix, _ = sequential_scan(torch.zeros_like(u), delta, A, Bt, Ct, h_in)  # C_t . (prod a) h_in, (B, t, E)
        y = y + fix
        end = end + decay * h_in
    c3 = clock()
    return y + D * u, end, {"scan_s": c1 - c0, "fix_s": c3 - c2}

"""One process's share of claim 17's measurements (e17_split_devices.py), run on each of P ranks by ``run_local``.

Three computations over one sequence of T positions (attention over ``attn_T`` when the setup gives one), each
timed ``calls`` times after a warm-up: ring attention forward + backward on this rank's zig-zag share, the SSM's
scan split by summaries (distributed/scan.py) on this rank's chunk, and an LSTM on its T/P steps, started only once
the previous rank hands over its final state (the relay: the exact split of a nonlinear recurrence); the two
recurrences each beside the whole sequence on rank 0 alone, in the same launch. Then one exchange of a key/value
block between neighbours, the communication a ring step waits for.

Each rank reports its own compute time per call on ``clock``: its thread's CPU time on CPUs (waits for peers and
turns given to other tenants excluded), synchronised wall time on a GPU. The caller turns them into critical paths.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from attnlab.timing import PeakMemory, map_large_allocations, now

def clock_for(dev: torch.device):
    """What one rank's own work costs: CPU time of this thread on CPUs, synchronised wall time on a GPU."""
    if dev.type == "cuda":
        return lambda: now(dev)
    return time.thread_time


def _wall(dev: torch.device) -> float:
    return now(dev)


def _attn_len(s: dict) -> int:
    """Attention's total length: its cost grows as T^2 and the recurrences' as T, so a setup may give attention a
    shorter sequence (``attn_T``) to keep the rounds affordable while the recurrences' chains stay long."""
    return s.get("attn_T", s["T"])


def _attention(rank, world, s, dev, clock, out) -> None:
    from attnlab.distributed import ring

    T = _attn_len(s)
    Tl, peak = ring.padded_len(T, world) // world, PeakMemory(dev)
    for call in range(s["calls"] + 1):
        peak.start()
        q, k, v = (torch.randn(1, s["H"], Tl, s["D"], device=dev, requires_grad=True) for _ in range(3))
        dist.barrier()
        w0, c0 = _wall(dev), clock()
        ring.ring_attention(q, k, v, causal=True, scale=s["D"] ** -0.5, seq_len=T).sum().backward()
        c1 = clock()
        dist.barrier()
        if call:  # the first call warms up
            out["attn_s"].append(c1 - c0)
            out["attn_wall_s"].append(_wall(dev) - w0)
            out["attn_peak_bytes"].append(peak.peak_bytes())
        del q, k, v


def _alone(clock, dev: torch.device, times: list, work, walls: list | None = None):
    """One call of the unsplit side: ``work`` (the whole sequence, on rank 0; falsy on the other ranks) between
    barriers, while the other ranks wait; when kept, its ``clock`` time appended to ``times`` (and its wall time to
    ``walls`` where given)."""
    def unsplit(keep):
        dist.barrier()
        if work:
            w0, c0 = _wall(dev), clock()
            work()
            c1, w1 = clock(), _wall(dev)
            if keep:
                times.append(c1 - c0)
                if walls is not None:
                    walls.append(w1 - w0)
        dist.barrier()
    return unsplit


def _alternate(split, unsplit, calls: int) -> None:
    """A warm-up pair, then ``calls`` pairs kept, the order of each pair alternating (one clock, both sides)."""
    for call in range(calls + 1):
        for fn in ((split, unsplit) if call % 2 == 0 else (unsplit, split)):
            fn(call > 0)


def _scan_inputs(B: int, t: int, E: int, N: int, seed: int, dev: torch.device) -> tuple:
    """Random inputs of the selective scan over t steps: u, delta (B, t, E); A (E, N); Bt, Ct (B, t, N); D (E,); h0
    (B, E, N)."""
    g = torch.Generator().manual_seed(seed)
    u, delta = torch.randn(B, t, E, generator=g), torch.rand(B, t, E, generator=g) * 0.1
    Bt, Ct = torch.randn(B, t, N, generator=g), torch.randn(B, t, N, generator=g)
    A, D, h0 = -torch.rand(E, N, generator=g) - 0.1, torch.randn(E, generator=g), torch.zeros(B, E, N)
    return tuple(x.to(dev) for x in (u, delta, A, Bt, Ct, D, h0))


def _ssm(rank, world, s, dev, clock, out) -> None:
    """The split scan on this rank's chunk; with P > 1 rank 0 also scans a whole sequence of T steps alone in the same
    launch (inputs of its own: only the time is compared), before or after each split call in turn, as the LSTM's
    relay is paired (``_lstm``): the split's critical path and the unsplit scan share one clock and one launch's pace."""
    from attnlab.distributed.scan import chunk_scan, scan_split, split_lengths

    B, E, N = s["ssm_batch"], s["ssm_dim"], s["ssm_state"]
    u, delta, A, Bt, Ct, D, h0 = _scan_inputs(B, split_lengths(s["T"], world)[rank], E, N, rank, dev)
    whole = _scan_inputs(B, s["T"], E, N, world, dev) if world > 1 and rank == 0 else None

    def split(keep):
        dist.barrier()
        w0 = _wall(dev)
        _, _, phases = scan_split(u, delta, A, Bt, Ct, D, h0, clock=clock)
        dist.barrier()
        if keep:
            out["ssm_scan_s"].append(phases["scan_s"])
            out["ssm_fix_s"].append(phases["fix_s"])
            out["ssm_wall_s"].append(_wall(dev) - w0)

    # what one process's scan_split does in its phase 1, over all T steps
    unsplit = _alone(clock, dev, out["ssm_whole_s"], whole is not None and (lambda: chunk_scan(*whole[:5], whole[6])),
                     out["ssm_whole_wall_s"])
    _alternate(split, unsplit, s["calls"])


@torch.no_grad()
def _lstm(rank, world, s, dev, clock, out) -> None:
    """The relay over T/P steps per rank, and with P > 1 rank 0 also runs the whole T steps alone in the same
    launch, before or after the relay in turn: the chain's time is compared with the unsplit run on one clock and
    in one process, not with another launch's (whose pace differed by up to 15% from launch to launch)."""
    dim = s["lstm_dim"]
    torch.manual_seed(rank)
    lstm = torch.nn.LSTM(dim, dim, batch_first=True).to(dev)
    x = torch.randn(1, s["T"] // world, dim, device=dev)  # this rank's stretch of the sequence
    whole = torch.randn(1, s["T"], dim, device=dev) if world > 1 and rank == 0 else None

    def relay(keep):
        dist.barrier()
        w0 = _wall(dev)
        h = torch.zeros(2, 1, 1, dim, device=dev)  # (h, c) stacked
        if rank > 0:
            dist.recv(h, rank - 1)  # the chain: wait for the previous stretch's final state
        c0 = clock()
        _, (hn, cn) = lstm(x, (h[0], h[1]))
        c1 = clock()
        if rank < world - 1:
            dist.send(torch.stack([hn, cn]).contiguous(), rank + 1)
        dist.barrier()
        if keep:
            out["lstm_s"].append(c1 - c0)
            out["lstm_wall_s"].append(_wall(dev) - w0)

    _alternate(relay, _alone(clock, dev, out["lstm_whole_s"], whole is not None and (lambda: lstm(whole))), s["calls"])


def _exchange_s(rank, world, s, dev) -> float:
    """Median wall time of passing one key/value block (this rank's k and v) to the next rank, as a ring step does."""
    if world == 1:
        return 0.0
    from attnlab.distributed import ring

    Tl = ring.padded_len(_attn_len(s), world) // world
    send, recv = torch.randn(2, 1, s["H"], Tl, s["D"], device=dev), torch.empty(2, 1, s["H"], Tl, s["D"], device=dev)
    times = []
    for _ in range(4):
        dist.barrier()
        w0 = _wall(dev)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        times.append(_wall(dev) - w0)
    return sorted(times[1:])[1]


def rank_work(rank: int, world: int, setup: dict, device: str, parts=("attn", "ssm", "lstm")) -> dict:
    """Rank ``rank`` of ``world``: the per-call times of ``parts`` and attention's per-call peak memory."""
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.device(device).type == "cuda" else torch.device("cpu")
    mapped = map_large_allocations() if dev.type == "cpu" else False
    clock = clock_for(dev)
    out = {k: [] for k in ("attn_s", "attn_wall_s", "attn_peak_bytes", "ssm_scan_s", "ssm_fix_s", "ssm_wall_s",
                           "ssm_whole_s", "ssm_whole_wall_s", "lstm_s", "lstm_wall_s", "lstm_whole_s")}
    for part, fn in (("attn", _attention), ("ssm", _ssm), ("lstm", _lstm)):
        if part in parts:
            fn(rank, world, setup, dev, clock, out)
    comm_s = _exchange_s(rank, world, setup, dev) if "attn" in parts else None
    return {**out, "comm_s": comm_s, "device": str(dev), "mapped": mapped}

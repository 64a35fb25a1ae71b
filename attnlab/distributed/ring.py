"""Ring attention: exact attention over a sequence split across ranks (Liu et al. 2023, arXiv 2310.01889).

Each rank keeps its own queries and passes key/value blocks around the ring; partial results over each
block are merged with the flash kernel's log-sum-exp (``merge_attention``'s formula, in place), so the result equals
single-process attention, forward and backward. Memory per rank is O(T/P) for q, k, v and outputs plus
one block in flight; the T x T scores never exist anywhere.

Layout (zig-zag, for causal load balance): the padded sequence is cut into 2P chunks of c tokens and rank
r holds chunks r and 2P-1-r. Under a causal mask chunk i sees chunks j <= i, so every rank does the same
work (Brandon et al. 2023, "striped"/zig-zag assignment). Chunk pairs wholly in the future are skipped,
pairs wholly in the past run unmasked, and only the diagonal pairs are masked. A sequence whose length
does not divide into 2P chunks is padded at the end; padded keys are masked (``kv_len``), padded queries
are computed and dropped by ``gather_sequence``.

Why not torch's context-parallel API (``torch.distributed.tensor.experimental.context_parallel``): in torch
2.13 it dispatches only the CUDA SDPA ops (aten._scaled_dot_product_flash/efficient/cudnn_attention), so
it does not run on CPU with gloo, and it cannot wrap attnlab's flash kernel. The ring here is built on
torch.distributed's point-to-point ops (``batch_isend_irecv``), which run on gloo and NCCL alike; the
next block's transfer is started before the current block is computed, so communication overlaps compute.

Backward: each rank recomputes its partials against the *final* out and log-sum-exp (P = exp(s - lse),
exact), and the key/value gradients travel around the ring with their block, arriving home after P hops.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from attnlab.models.flash import tile_backward, tile_forward


def padded_len(T: int, world: int) -> int:
    """The sequence length rounded up to 2*world equal chunks (two per rank)."""
    return math.ceil(T / (2 * world)) * 2 * world


def chunk_ids(rank: int, world: int) -> tuple[int, int]:
    """Zig-zag: rank r holds chunks r and 2*world-1-r of 2*world."""
    return rank, 2 * world - 1 - rank


def local_positions(T: int, world: int, rank: int, device=None) -> torch.Tensor:
    """(2c,) global positions of this rank's tokens (padded positions included)."""
    c = padded_len(T, world) // (2 * world)
    return torch.cat([torch.arange(i * c, (i + 1) * c, device=device) for i in chunk_ids(rank, world)])


def shard_sequence(x: torch.Tensor, world: int, rank: int, dim: int = 1, pad_value=0) -> torch.Tensor:
    """This rank's part of a full sequence along ``dim``: padded to 2*world chunks, chunks r and 2*world-1-r."""
    T = x.shape[dim]
    Tp = padded_len(T, world)
    if Tp > T:
        shape = list(x.shape)
        shape[dim] = Tp - T
        x = torch.cat([x, x.new_full(shape, pad_value)], dim=dim)
    chunks = x.chunk(2 * world, dim=dim)
    a, b = chunk_ids(rank, world)
    return torch.cat([chunks[a], chunks[b]], dim=dim)


def gather_sequence(x: torch.Tensor, T: int, world: int, dim: int = 1, group=None) -> torch.Tensor:
    """Inverse of shard_sequence on every rank: all-gather the parts and put the chunks back in order."""
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    chunks = [None] * (2 * world)
    for r, part in enumerate(parts):
        a, b = chunk_ids(r, world)
        chunks[a], chunks[b] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim).narrow(dim, 0, T)


def _pairs(rank_q: int, rank_k: int, world: int, c: int, T: int, causal: bool):
    """(local q chunk, remote k chunk, causal mask needed, kv_len or None) for the chunk pairs to compute.

    Pairs whose keys are all in the queries' future, or all padding, are left out."""
    out = []
    for qi, qc in enumerate(chunk_ids(rank_q, world)):
        for ki, kc in enumerate(chunk_ids(rank_k, world)):
            if causal and kc > qc:
                continue  # wholly in the future: skipped (this is where zig-zag balances the work)
            real = T - kc * c  # real (unpadded) keys in this chunk
            if real <= 0:
                continue
            out.append((qi, ki, causal and kc == qc, real if real < c else None))
    return out


def _attend(q5, k, v, pairs, c, scale, out, lse):
    """Merge the partials of this rank's q chunks over one key/value block into (out, lse), in place."""
    k5, v5 = k[:, :, None], v[:, :, None]  # (B, Hkv, 1, 2c, D)
    B = q5.shape[0]
    qp = torch.arange(c, device=q5.device)[None]  # within a diagonal pair, query i sits at key position i
    for qi, ki, diag, real in pairs:
        qs, ks = slice(qi * c, (qi + 1) * c), slice(ki * c, (ki + 1) * c)
        kv_len = None if real is None else torch.full((B,), real, device=q5.device)
        o, l = tile_forward(q5[..., qs, :], k5[..., ks, :], v5[..., ks, :], qp, diag, None, None, scale, kv_len)
        _merge_into(out[..., qs, :], lse[..., qs], o, l)


def _merge_into(out, lse, o, l):
    """merge_attention (flash.py) written into (out, lse) in place: no chunk-sized temporaries beyond one.

    out = out * e^(lse - lse') + o * e^(l - lse'), lse' = log(e^lse + e^l); a part with lse -inf adds nothing."""
    new = torch.logaddexp(lse, l)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    out.mul_(torch.exp(lse - safe)[..., None]).add_(o.float().mul_(torch.exp(l - safe)[..., None]))
    lse.copy_(new)


def _start_shift(bufs, group, world, rank):
    """Send each buffer to the next rank and receive the previous rank's into fresh buffers (async)."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    recv = [torch.empty_like(b, memory_format=torch.contiguous_format) for b in bufs]
    ops = [dist.P2POp(dist.isend, b, dist.get_global_rank(group, nxt) if group else nxt, group) for b in bufs]
    ops += [dist.P2POp(dist.irecv, b, dist.get_global_rank(group, prv) if group else prv, group) for b in recv]
    return dist.batch_isend_irecv(ops), recv


def _wait(reqs):
    for r in reqs:
        r.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, T):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        B, H, Tl, D = q.shape
        Hkv = k.shape[1]
        c = Tl // 2
        q5 = q.reshape(B, Hkv, H // Hkv, Tl, D)  # query heads grouped under their kv head (GQA without copies)
        out = torch.zeros(B, Hkv, H // Hkv, Tl, D, dtype=torch.float32, device=q.device)
        lse = torch.full((B, Hkv, H // Hkv, Tl), float("-inf"), device=q.device)
        kv = [k.contiguous(), v.contiguous()]  # the block in hand; the next one arrives while this one is used
        for step in range(world):
            reqs, nxt = _start_shift(kv, group, world, rank) if step < world - 1 else ([], None)
            src = (rank - step) % world
            _attend(q5, kv[0], kv[1], _pairs(rank, src, world, c, T, causal), c, scale, out, lse)
            _wait(reqs)
            kv = nxt
        out = out.to(q.dtype)  # no copy in fp32
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (group, causal, scale, T)
        return out.reshape(B, H, Tl, D)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, T = ctx.args
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        B, H, Tl, D = q.shape
        Hkv = k.shape[1]
        c = Tl // 2
        q5 = q.reshape(B, Hkv, H // Hkv, Tl, D)
        do5 = dout.reshape(q5.shape).contiguous()
        dq = torch.zeros_like(q5, dtype=torch.float32)
        kv = [k.contiguous(), v.contiguous()]
        dkv = [torch.zeros_like(t, dtype=torch.float32) for t in kv]  # contiguous like kv; travels with its block
        qp = torch.arange(c, device=q.device)[None]
        for step in range(world):
            src = (rank - step) % world
            k5, v5 = kv[0][:, :, None], kv[1][:, :, None]
            for qi, ki, diag, real in _pairs(rank, src, world, c, T, causal):
                qs, ks = slice(qi * c, (qi + 1) * c), slice(ki * c, (ki + 1) * c)
                kv_len = None if real is None else torch.full((B,), real, device=q.device)
                g_q, g_k, g_v = tile_backward(q5[..., qs, :], k5[..., ks, :], v5[..., ks, :], out[..., qs, :],
                                              lse[..., qs], do5[..., qs, :], qp, diag, None, None, scale, kv_len)
                dq[..., qs, :] += g_q
                dkv[0][..., ks, :] += g_k[:, :, 0]
                dkv[1][..., ks, :] += g_v[:, :, 0]
            # pass the block and its gradients on; after `world` hops the gradients are home again
            bufs = dkv if step == world - 1 else kv + dkv
            if world > 1:
                reqs, recv = _start_shift(bufs, group, world, rank)
                _wait(reqs)
                kv, dkv = (kv, recv) if step == world - 1 else (recv[:2], recv[2:])
        return (dq.to(q.dtype).reshape(B, H, Tl, D), dkv[0].to(k.dtype), dkv[1].to(v.dtype),
                None, None, None, None)


def ring_attention(q, k, v, *, causal: bool, scale: float, seq_len: int, group=None) -> torch.Tensor:
    """Exact attention of this rank's queries over the whole sequence's keys.

    q (B, H, 2c, D), k, v (B, Hkv, 2c, D): this rank's two zig-zag chunks (``shard_sequence``) of a
    sequence of ``seq_len`` real tokens; returns this rank's out (B, H, 2c, D). Every rank of ``group``
    must call it together, with the same shapes."""
    world = dist.get_world_size(group)
    if q.shape[-2] % 2 or q.shape[-2] * world != padded_len(seq_len, world):
        raise ValueError(f"ring_attention: {q.shape[-2]} local positions do not match a sequence of {seq_len} "
                         f"tokens over {world} ranks (expected {padded_len(seq_len, world) // world}); "
                         "split it with shard_sequence")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"ring_attention: n_kv_heads={k.shape[1]} must divide n_heads={q.shape[1]}")
    return _RingAttention.apply(q, k, v, group, causal, scale, seq_len)


class RingState:
    """The model contract's state, used to run a transformer sequence-parallel from outside the model.

    ``model(local_tokens, state=RingState(...))``: ``begin`` hands the model this rank's global positions
    (so rotary/learned positions are right), and ``attention`` runs ring attention instead of the layer's
    kernel. Nothing is cached: it is a training/prefill pass, not decoding."""

    lengths = None

    def __init__(self, seq_len: int, group=None, causal: bool = True):
        self.seq_len, self.group, self.causal = seq_len, group, causal
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def begin(self, tokens: torch.Tensor, lengths=None) -> torch.Tensor:
        if lengths is not None:
            raise ValueError("sequence parallelism takes whole rows: lengths is not supported")
        # padded positions (past the sequence's end) are clamped into it: their keys are masked and their
        # queries dropped, and a learned position table has no rows beyond max_seq_len
        return local_positions(self.seq_len, self.world, self.rank, tokens.device).clamp(max=self.seq_len - 1)

    def attention(self, layer: int, q, k, v, attend):
        if attend.ordered:
            raise ValueError("sequence parallelism does not support ALiBi positions; use --pos rope or learned")
        scale = q.shape[-1] ** -0.5
        return ring_attention(q, k, v, causal=self.causal, scale=scale, seq_len=self.seq_len, group=self.group)

    def commit(self) -> None:
        pass

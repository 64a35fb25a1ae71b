"""The states behind the contract ``logits, state = model(tokens, state, lengths=None)``.

A state is a batch of sequences, one row each, and every row has its own position: sequences in one
batch sit at different lengths. ``State`` (below) is the interface every family implements. A forward
over tokens (B, T) goes through the state in three moves the model makes, never the engine:

    positions = state.begin(tokens, lengths)   # (B, T) positions of the new tokens; lengths (B,) or None
    ...  each layer reads and extends its part of the state (a KV cache's ``attention``, a hidden vector)
    state.commit()                             # row b has now consumed lengths[b] (or T) more tokens

``lengths`` makes a batch ragged: row b's tokens beyond lengths[b] are filler that is never stored and
never seen by a real token (their outputs are discarded). That is all the padding there is.

The transformer's state grows with the context (``KVCache`` here, written by index; ``PagedKVCache`` in
paged.py, blocks from a shared pool); the sliding kernel keeps a ring of ``window`` positions; the
recurrent, linear-attention and SSM states are fixed-size tensors whatever the context length (fixed_state.py).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from attnlab.errors import AttnlabError
from attnlab.models.cache_attention import DECODE_DTYPES, NO_TABLE, fused_decode, per_row_attention


@runtime_checkable
class State(Protocol):
    """What every family's state offers the model, the engine and the cost tracer."""

    pos: torch.Tensor  # (B,) int64 on the CPU: tokens consumed by each sequence

    @property
    def batch_size(self) -> int: ...

    @property
    def nbytes(self) -> int: ...  # bytes held now

    @property
    def bytes_per_token(self) -> int: ...  # growth per cached token and sequence (0 for a fixed-size state)

    def begin(self, tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor: ...

    def commit(self) -> None: ...

    def rollback(self, pos: int | Sequence[int] | torch.Tensor) -> None: ...  # per sequence

    def add_sequence(self) -> int: ...  # a new empty sequence as the last row; returns its row

    def release(self, row: int) -> None: ...  # drop a row (later rows move up); paged: its blocks are freed

    def take(self, rows: Sequence[int]) -> "State": ...  # move rows out into a state of their own

    def extend(self, other: "State") -> None: ...  # append another state's rows (same kind and shapes)


def as_positions(pos, batch_size: int) -> torch.Tensor:
    """An int, a list or a tensor of per-sequence positions -> (B,) int64 CPU tensor."""
    if isinstance(pos, int):
        return torch.full((batch_size,), pos, dtype=torch.long)
    out = torch.as_tensor(pos, dtype=torch.long).cpu().reshape(-1)
    if out.numel() != batch_size:
        raise AttnlabError(f"got {out.numel()} positions for a batch of {batch_size} sequences")
    return out


class Rows:
    """Per-sequence position bookkeeping shared by every state (a mixin: subclasses hold the tensors)."""

    pos: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.pos.numel())

    def _begin(self, tokens: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        B, T = tokens.shape
        if B != self.batch_size:
            raise AttnlabError(f"tokens have {B} rows but the state holds {self.batch_size} sequences; "
                               "give one row per sequence (add_sequence / release change the batch)")
        if lengths is not None:
            lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
            if lengths.shape != (B,) or int(lengths.min()) < 1 or int(lengths.max()) > T:
                raise AttnlabError(f"lengths must be (B,)={B} counts in 1..T={T}, got {lengths.tolist()}")
            if bool((lengths == T).all()):
                lengths = None
        self._lengths, self._T = lengths, T
        steps = torch.arange(T)[None, :]
        if lengths is not None:  # filler repeats its row's last real position: it stays inside every table
            steps = torch.minimum(steps, (lengths - 1)[:, None])
        return self.pos[:, None] + steps  # (B, T) on the CPU; the model moves it to its device

    @property
    def lengths(self) -> torch.Tensor | None:
        """Real tokens per row in the forward under way, or None when every row's T tokens are real."""
        return self._lengths

    @property
    def uniform(self) -> bool:
        """Every row at the same position with the same number of new tokens: one slice serves them all."""
        if self._lengths is not None:
            return False
        return self.batch_size <= 1 or bool((self.pos == self.pos[0]).all())

    def valid_mask(self, device) -> torch.Tensor | None:
        """(B, T) True on real tokens, or None when all are real."""
        if self._lengths is None:
            return None
        return torch.arange(self._T)[None, :].lt(self._lengths[:, None]).to(device)

    def commit(self) -> None:
        self.pos = self.pos + (self._T if self._lengths is None else self._lengths)


def _split_rows(cache: "KVCache", rows: list[int]):
    """Remove `rows` from a contiguous cache; return (k, v, pos) of the removed rows. Rows that stay are
    copied only when rows before them leave (a slice otherwise), and taking every row copies nothing; a slice
    keeps the whole allocation alive until the last of its rows goes."""
    gone = set(rows)
    keep = [r for r in range(cache.batch_size) if r not in gone]

    def pick(t, idx):
        if not idx:
            return t[:0]
        if idx == list(range(idx[0], idx[-1] + 1)):
            return t[idx[0]:idx[-1] + 1]  # a contiguous range of rows: a view
        return t[idx]

    out = ([pick(t, rows) for t in cache.k], [pick(t, rows) for t in cache.v], cache.pos[rows].clone())
    cache.k, cache.v = [pick(t, keep) for t in cache.k], [pick(t, keep) for t in cache.v]
    cache.pos = cache.pos[keep]
    cache._spare = None  # rows handed out may be views of the spare rows' storage: extend must not write there
    return out


class KVCache(Rows):
    """Contiguous cache: per layer keys and values (B, Hkv, max_len, D), allocated once, written by index.

    Row b holds its positions 0..pos[b]-1 in slots of the same number. A batch whose rows sit at one
    position writes one slice and attends to a view in one call; a ragged batch writes each row's slots by
    index and attends row by row, each over a view of exactly its own keys.
    """

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], pos: torch.Tensor | None = None):
        self.k, self.v = k, v
        self.pos = torch.zeros(k[0].shape[0], dtype=torch.long) if pos is None else pos
        self._lengths, self._T = None, 0
        self._decode = False
        self._spare = None  # extend's storage: [per layer k, then v] (capacity, Hkv, slots, D), k and v its first rows

    @classmethod
    def allocate(cls, n_layers, batch_size, n_kv_heads, max_len, head_dim, dtype=torch.float32, device="cpu"):
        # Zeros, not empty: a ragged batch reads slots past a row's length (masked, weight 0), and 0 * NaN from
        # uninitialised memory would still be NaN.
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)])

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def nbytes(self) -> int:
        """The rows' bytes: 2 * layers * B * Hkv * max_len * D * element size (a cache grown by ``extend`` may hold
        up to as many again in spare rows)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self) -> int:
        """2 * layers * Hkv * D * element size, per sequence."""
        t = self.k[0]
        return 2 * len(self.k) * t.shape[1] * t.shape[3] * t.element_size()

    @property
    def used_bytes(self) -> int:
        return self.bytes_per_token * int(self.pos.sum())

    def begin(self, tokens, lengths=None):
        positions = self._begin(tokens, lengths)
        if self.uniform:  # one slice for every row (the common case: one sequence, or a batch in step)
            end = (int(self.pos[0]) if self.batch_size else 0) + self._T
            if end > self.max_len:
                raise AttnlabError(f"KV cache full: {end} tokens > max_len {self.max_len}; "
                                   "allocate the state with a larger max_len")
            self._plan = None
            self._start, self._ends = end - self._T, torch.full((self.batch_size,), end, dtype=torch.long)
            self._decode = self.k[0].device.type == "cpu"
            return positions
        need = self.pos + (self._T if self._lengths is None else self._lengths)
        self._ends = need  # (B,): each row's keys after this forward, for the decode kernel (once a step, not a layer)
        self._decode = self._lengths is None and self.k[0].device.type == "cpu"
        if int(need.max()) > self.max_len:
            raise AttnlabError(f"KV cache full: {int(need.max())} tokens > max_len {self.max_len}; "
                               "allocate the state with a larger max_len")
        dev = self.k[0].device  # ragged: each real token written at its own slot; each row attends to its keys
        valid = torch.arange(self._T)[None, :] < (need - self.pos)[:, None]  # (B, T)
        rows, cols = valid.nonzero(as_tuple=True)
        self._plan = (rows.to(dev), positions[rows, cols].to(dev), valid.reshape(-1).to(dev), need.tolist(),
                      (need - self.pos).tolist())
        return positions

    def attention(self, layer: int, q, k, v, attend):
        """Store the new k, v (B, Hkv, T, D); return attend(q, keys, values, q_pos=, kv_len=) (attention.Attend)."""
        T = k.shape[2]
        K, V = self.k[layer], self.v[layer]
        if self._plan is None:
            start = self._start
            K[:, :, start:start + T] = k
            V[:, :, start:start + T] = v
            out = fused_decode(q, K, V, K.stride()[:3], self._ends, attend) if T == 1 else None
            return attend(q, K[:, :, :start + T], V[:, :, :start + T]) if out is None else out
        rows, slots, valid, ends, news = self._plan
        B, Hkv, _, D = k.shape
        flat_k = k.transpose(1, 2).reshape(B * T, Hkv, D)[valid]  # (N real tokens, Hkv, D)
        flat_v = v.transpose(1, 2).reshape(B * T, Hkv, D)[valid]
        K[rows, :, slots] = flat_k.to(K.dtype)  # index_put does not convert (the compiled step's k is fp32)
        V[rows, :, slots] = flat_v.to(V.dtype)
        out = fused_decode(q, K, V, K.stride()[:3], self._ends, attend) if T == 1 else None
        return per_row_attention(q, K, V, ends, news, attend) if out is None else out

    def decode_slots(self, layer: int) -> tuple | None:
        """Where a forward whose T tokens are all real (a decode step, a speculative verification) writes and
        reads in ``layer``, for the compiled block step (kernels/block_step.cpp block_decode): (keys, values,
        stride_b, stride_h, stride_s, write slot per token (B*T,), block tables (none), block size (0), keys per row
        after the write (B,)); None where some rows carry filler."""
        if not self._decode:
            return None
        K, V = self.k[layer], self.v[layer]
        if K.dtype not in DECODE_DTYPES or K.stride(-1) != 1 or V.stride() != K.stride():
            return None  # an fp16 cache, say: the forward's attention widens it
        slots = self.pos if self._T == 1 else (self.pos[:, None] + torch.arange(self._T)).reshape(-1)
        return K, V, *K.stride()[:3], slots.contiguous(), NO_TABLE, 0, self._ends.contiguous()

    def rollback(self, pos) -> None:
        """Forget each row's slots from pos[b] on (speculative rejection, prefix reuse): later writes overwrite."""
        new = as_positions(pos, self.batch_size)
        if bool((new < 0).any()) or bool((new > self.pos).any()):
            raise AttnlabError(f"cannot roll a KV cache at {self.pos.tolist()} back to {new.tolist()}")
        self.pos = new

    def add_sequence(self) -> int:
        """A zeroed row at the end, written in place in the growing storage (not a one-row cache copied in: a batch
        of 64 rows admitted one at a time then allocates, zeroes and copies each row once instead of twice)."""
        B = self.batch_size
        if B == 0:
            self.extend(KVCache.allocate(len(self.k), 1, self.k[0].shape[1], self.max_len, self.k[0].shape[3],
                                         self.k[0].dtype, self.k[0].device))
            return 0
        spare = self._room(1)
        for t in spare:
            t[B].zero_()
        self._adopt(spare, B + 1, torch.cat([self.pos, self.pos.new_zeros(1)]))
        return B

    def take(self, rows) -> "KVCache":
        out = type(self)(*_split_rows(self, list(rows)))
        return out

    def release(self, row: int) -> None:
        _split_rows(self, [row])

    def extend(self, other: "KVCache") -> None:
        """Append other's rows. The rows live in storage of doubling capacity, so n rows added one at a time (a
        batch being admitted) cost O(n) row copies, where concatenating whole caches cost O(n^2)."""
        if other.k[0].shape[2] != self.k[0].shape[2]:
            raise AttnlabError(f"cannot join caches of {other.k[0].shape[2]} and {self.k[0].shape[2]} slots per row")
        ours, theirs = self.k[0], other.k[0]
        if (len(other.k) != len(self.k) or theirs.shape[1:] != ours.shape[1:] or theirs.dtype != ours.dtype
                or theirs.device != ours.device):  # copy_ below would broadcast or convert where it should refuse
            raise AttnlabError(f"cannot join a cache of {len(other.k)} layers x {tuple(theirs.shape[1:])} {theirs.dtype} "
                               f"on {theirs.device} to one of {len(self.k)} layers x {tuple(ours.shape[1:])} "
                               f"{ours.dtype} on {ours.device}")
        if self.batch_size == 0:  # adopt the other's tensors: no copy
            self.k, self.v, self.pos, self._spare = other.k, other.v, other.pos, None
            return
        B, n = self.batch_size, other.batch_size
        spare = self._room(n)
        for s, t in zip(spare, other.k + other.v):
            s[B:B + n].copy_(t)
        self._adopt(spare, B + n, torch.cat([self.pos, other.pos]))

    def _room(self, n: int) -> list:
        """The growing storage ([per layer k, then v] (capacity, Hkv, slots, D)) with room for n more rows after the
        current ones, which it holds (copied over when the capacity doubles)."""
        B, mine = self.batch_size, self.k + self.v
        spare = self._spare
        if spare is not None and any(t.data_ptr() != s.data_ptr() for t, s in zip(mine, spare)):
            spare = None  # the rows were replaced since: the storage no longer holds them
        if spare is None or spare[0].shape[0] < B + n:
            cap = max(B + n, 2 * B)
            spare = [t.new_empty((cap,) + t.shape[1:]) for t in mine]
            for s, t in zip(spare, mine):
                s[:B].copy_(t)
        return spare

    def _adopt(self, spare: list, rows: int, pos: torch.Tensor) -> None:
        """Make the storage's first ``rows`` rows the cache's, at positions ``pos``."""
        L = len(self.k)
        self.k, self.v = [s[:rows] for s in spare[:L]], [s[:rows] for s in spare[L:]]  # (rows, Hkv, slots, D)
        self.pos, self._spare = pos, spare


class RollingKVCache(KVCache):
    """Sliding-window cache: ``window`` slots per layer and row, position p of row b in slot p % window.

    Its bytes are constant in the context length. Decode (T=1) writes each row's new key into its slot and
    attends to the whole ring (every held key is inside the window; softmax does not care about order, and
    RoPE was applied before storing). Longer chunks, ALiBi (whose bias needs the keys in order) and ragged
    rows attend row by row to the ring unrolled in position order followed by the new keys."""

    @property
    def window(self) -> int:
        return self.k[0].shape[2]

    max_len = property(lambda self: 1 << 62)  # a ring never fills up

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self) -> int:
        return 0  # constant: the ring does not grow

    @property
    def used_bytes(self) -> int:
        return self.nbytes

    def begin(self, tokens, lengths=None):
        positions = self._begin(tokens, lengths)
        self._plan = None
        return positions

    def decode_slots(self, layer: int) -> None:
        return None  # a ring's slots are not positions: its own attention writes them

    def _ordered(self, ring: torch.Tensor, row: int) -> torch.Tensor:
        p = int(self.pos[row])
        held = min(p, self.window)
        idx = torch.arange(p - held, p, device=ring.device) % self.window
        return ring[row:row + 1].index_select(2, idx)  # (1, Hkv, held, D) in position order

    def attention(self, layer: int, q, k, v, attend):
        T, W, B = k.shape[2], self.window, k.shape[0]
        ring_k, ring_v = self.k[layer], self.v[layer]
        if T == 1 and not attend.ordered:
            rows = torch.arange(B, device=k.device)
            slot = (self.pos % W).to(k.device)
            ring_k[rows, :, slot] = k[:, :, 0]
            ring_v[rows, :, slot] = v[:, :, 0]
            held = (self.pos + 1).clamp(max=W)
            S = int(held.max())
            # The whole ring is in the window: query position held-1 sees every held slot.
            return attend(q, ring_k[:, :, :S], ring_v[:, :, :S], q_pos=(held - 1)[:, None].to(k.device),
                       kv_len=held.to(k.device))
        out = torch.zeros_like(q)
        for b in range(B):  # a chunk per row: the ring unrolled in order, then the row's real new keys
            n = T if self._lengths is None else int(self._lengths[b])
            prev_k, prev_v = self._ordered(ring_k, b), self._ordered(ring_v, b)
            keys = torch.cat([prev_k, k[b:b + 1, :, :n]], dim=2)
            vals = torch.cat([prev_v, v[b:b + 1, :, :n]], dim=2)
            out[b:b + 1, :, :n] = attend(q[b:b + 1, :, :n], keys, vals)
            keep = min(n, W)  # the newest positions go into their slots
            p = int(self.pos[b])
            slots = torch.arange(p + n - keep, p + n, device=k.device) % W
            ring_k[b, :, slots] = k[b, :, n - keep:n]
            ring_v[b, :, slots] = v[b, :, n - keep:n]
        return out

    def rollback(self, pos) -> None:
        new = as_positions(pos, self.batch_size)
        if not torch.equal(new, self.pos):
            raise AttnlabError(f"a sliding-window cache at {self.pos.tolist()} cannot roll back to {new.tolist()}: "
                               "its ring has overwritten older positions")

    def add_sequence(self) -> int:
        self.extend(RollingKVCache.allocate(len(self.k), 1, self.k[0].shape[1], self.window, self.k[0].shape[3],
                                            self.k[0].dtype, self.k[0].device))
        return self.batch_size - 1

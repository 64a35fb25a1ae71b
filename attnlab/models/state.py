"""The states behind the contract ``logits, state = model(tokens, state)``.

A state knows its position (tokens consumed so far) and its size in bytes. The transformer's state
grows with the context (a KV cache, preallocated and written by index); the recurrent families'
state is a fixed-size vector whatever the context length. That difference is one of the trades this
project measures.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError


def _kv_buffers(n_layers: int, shape: tuple, dtype, device):
    """Per-layer key and value buffers of `shape`. Empty, not zeros: every slot is written before it is read
    (a linear cache reads only slots below pos; a ring reads only the slots it has filled)."""
    return ([torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)],
            [torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)])


@dataclass
class KVCache:
    """Per layer, keys and values of shape (B, Hkv, max_len, D), allocated once and written by index."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    pos: int = 0
    pad: torch.Tensor | None = None  # (B,) left-padding slots per sequence; None = no padding

    @classmethod
    def allocate(cls, n_layers, batch_size, n_kv_heads, max_len, head_dim, dtype=torch.float32, device="cpu"):
        return cls(*_kv_buffers(n_layers, (batch_size, n_kv_heads, max_len, head_dim), dtype, device))

    @property
    def max_len(self) -> int:
        return self.k[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.k[0].shape[0]

    @property
    def nbytes(self) -> int:
        """Allocated bytes: 2 * layers * B * Hkv * max_len * D * element size."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    @property
    def bytes_per_token(self) -> int:
        """2 * layers * Hkv * D * element size, per sequence in the batch."""
        return self.nbytes // (self.max_len * self.batch_size)

    @property
    def used_bytes(self) -> int:
        return self.bytes_per_token * self.pos * self.batch_size

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor, ordered: bool = False):
        """Store the new keys/values; return (keys, values, q_offset, kv_start) for the kernel."""
        k_all, v_all = self.update(layer, k, v)
        return k_all, v_all, self.pos, self.pad

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v (B, Hkv, T, D) at positions pos..pos+T-1; return views of everything up to there."""
        T = k.shape[2]
        end = self.pos + T
        if end > self.max_len:
            raise AttnlabError(f"KV cache full: {self.pos} cached + {T} new tokens > max_len {self.max_len}; "
                               "allocate the state with a larger max_len")
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.pos += n

    def positions(self, T: int, device) -> torch.Tensor:
        """Positions of the next T tokens: (T,) slots, or (B, T) counted from each sequence's first real token."""
        slots = torch.arange(self.pos, self.pos + T, device=device)
        if self.pad is None:
            return slots
        return (slots[None, :] - self.pad[:, None]).clamp(min=0)

    def rollback(self, pos: int) -> None:
        """Forget everything from slot ``pos`` on (speculative rejection, prefix reuse): later writes overwrite."""
        if not 0 <= pos <= self.pos:
            raise AttnlabError(f"cannot roll a KV cache at {self.pos} back to {pos}")
        self.pos = pos

    def reset(self) -> None:
        self.pos = 0
        self.pad = None


class FixedState:
    """Bookkeeping shared by states whose size does not grow (recurrent, linear attention, SSM):
    they cannot forget, so they roll back only to where they are (or to 0 by resetting)."""

    pos: int
    pad: torch.Tensor | None

    bytes_per_token = property(lambda self: 0)  # constant: the state does not grow with the context
    used_bytes = property(lambda self: self.nbytes)

    def advance(self, n: int) -> None:
        self.pos += n

    def positions(self, T: int, device) -> torch.Tensor:
        slots = torch.arange(self.pos, self.pos + T, device=device)
        return slots if self.pad is None else (slots[None, :] - self.pad[:, None]).clamp(min=0)

    def rollback(self, pos: int) -> None:
        if pos == self.pos:
            return
        if pos == 0:
            self.reset()
            return
        raise AttnlabError(f"a {type(self).__name__} at position {self.pos} cannot roll back to {pos}: it keeps no "
                           "history; clone it before the tokens you may want to undo")

    def reset(self) -> None:
        self.pos, self.pad = 0, None
        for t in self.tensors():
            t.zero_()

    def tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


@dataclass
class RollingKVCache:
    """Sliding-window cache: exactly `window` slots per layer, position p stored in slot p % window.

    Its bytes are constant in the context length. Decode (T=1) writes the new key into its slot and
    attends to the whole ring (every held key is inside the window, and softmax does not care about
    order; RoPE was applied before storing). Longer chunks, or ALiBi (whose bias needs positions in
    order), attend to the ring unrolled in position order followed by the new keys."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    pos: int = 0
    pad: torch.Tensor | None = None

    @classmethod
    def allocate(cls, n_layers, batch_size, n_kv_heads, window, head_dim, dtype=torch.float32, device="cpu"):
        return cls(*_kv_buffers(n_layers, (batch_size, n_kv_heads, window, head_dim), dtype, device))

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

    def _ordered(self, ring: torch.Tensor) -> torch.Tensor:
        held = min(self.pos, self.window)
        start = self.pos - held
        idx = torch.arange(start, self.pos, device=ring.device) % self.window
        return ring.index_select(2, idx)  # (B, Hkv, held, D) in position order

    def attend(self, layer: int, k: torch.Tensor, v: torch.Tensor, ordered: bool = False):
        if self.pad is not None:
            raise AttnlabError("the sliding-window cache does not take left-padded batches; generate one prompt "
                               "at a time or use kernel flash")
        T, W = k.shape[2], self.window
        if T == 1 and not ordered:
            slot = self.pos % W
            self.k[layer][:, :, slot] = k[:, :, 0]
            self.v[layer][:, :, slot] = v[:, :, 0]
            held = min(self.pos + 1, W)
            return self.k[layer][:, :, :held], self.v[layer][:, :, :held], held - 1, None
        prev_k, prev_v = self._ordered(self.k[layer]), self._ordered(self.v[layer])
        k_all, v_all = torch.cat([prev_k, k], dim=2), torch.cat([prev_v, v], dim=2)
        keep = min(T, W)  # the newest positions go into their slots
        slots = torch.arange(self.pos + T - keep, self.pos + T, device=k.device) % W
        self.k[layer][:, :, slots] = k[:, :, T - keep:]
        self.v[layer][:, :, slots] = v[:, :, T - keep:]
        return k_all, v_all, prev_k.shape[2], None

    def advance(self, n: int) -> None:
        self.pos += n

    def positions(self, T: int, device) -> torch.Tensor:
        return torch.arange(self.pos, self.pos + T, device=device)

    def rollback(self, pos: int) -> None:
        if pos != self.pos:
            raise AttnlabError(f"a sliding-window cache at {self.pos} cannot roll back to {pos}: its ring has "
                               "overwritten older positions")

    def reset(self) -> None:
        self.pos = 0
        self.pad = None


@dataclass
class RecurrentState(FixedState):
    """Hidden vectors (L, B, dim) (and the LSTM's cell vectors): the same bytes at any context length."""

    h: torch.Tensor
    c: torch.Tensor | None = None
    pos: int = 0
    pad: torch.Tensor | None = None  # (B,) left-padding slots: the state does not change on them

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.h, self.c) if t is not None]

    def clone(self) -> "RecurrentState":
        return RecurrentState(h=self.h.clone(), c=None if self.c is None else self.c.clone(), pos=self.pos,
                              pad=self.pad)

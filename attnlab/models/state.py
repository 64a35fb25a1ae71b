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


@dataclass
class KVCache:
    """Per layer, keys and values of shape (B, Hkv, max_len, D), allocated once and written by index."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    pos: int = 0
    pad: torch.Tensor | None = None  # (B,) left-padding slots per sequence; None = no padding

    @classmethod
    def allocate(cls, n_layers, batch_size, n_kv_heads, max_len, head_dim, dtype=torch.float32, device="cpu"):
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        # empty, not zeros: slots are always written before they are read (reads stop at pos)
        return cls(k=[torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)],
                   v=[torch.empty(shape, dtype=dtype, device=device) for _ in range(n_layers)])

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


@dataclass
class RecurrentState:
    """Hidden vectors (L, B, dim) (and the LSTM's cell vectors): the same bytes at any context length."""

    h: torch.Tensor
    c: torch.Tensor | None = None
    pos: int = 0
    pad: torch.Tensor | None = None  # (B,) left-padding slots: the state does not change on them

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.h, self.c) if t is not None)

    @property
    def bytes_per_token(self) -> int:
        return 0  # the state does not grow with the context

    @property
    def used_bytes(self) -> int:
        return self.nbytes

    def advance(self, n: int) -> None:
        self.pos += n

    def rollback(self, pos: int) -> None:
        """A recurrent state cannot forget: it only rolls back to where it already is (or to 0)."""
        if pos == self.pos:
            return
        if pos == 0:
            self.reset()
            return
        raise AttnlabError(f"a recurrent state at position {self.pos} cannot roll back to {pos}: it keeps no "
                           "history; snapshot it with clone() before the tokens you may want to undo")

    def clone(self) -> "RecurrentState":
        return RecurrentState(h=self.h.clone(), c=None if self.c is None else self.c.clone(), pos=self.pos,
                              pad=self.pad)

    def reset(self) -> None:
        self.pos = 0
        self.pad = None
        self.h.zero_()
        if self.c is not None:
            self.c.zero_()

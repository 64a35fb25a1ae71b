"""States whose size does not grow with the context: the recurrent families', linear attention's and the SSM's
(the ``State`` contract, state.py)."""
from __future__ import annotations

import torch

from attnlab.errors import AttnlabError
from attnlab.models.state import Rows, as_positions


class FixedState(Rows):
    """Bookkeeping shared by states whose size does not grow (recurrent, linear attention, SSM).

    Subclasses hold tensors with the batch on dimension 1, (L, B, ...). Such a state cannot forget, so a
    row rolls back only to where it is, or to 0 (a fresh zero state)."""

    def __init__(self, tensors: dict[str, torch.Tensor], pos: torch.Tensor | None = None):
        self.t = tensors
        first = next(iter(tensors.values()))
        self.pos = torch.zeros(first.shape[1], dtype=torch.long) if pos is None else pos
        self._lengths, self._T = None, 0

    def __getattr__(self, name):  # state.h, state.S ...: the named tensors
        t = self.__dict__.get("t")
        if t is not None and name in t:
            return t[name]
        raise AttributeError(name)

    bytes_per_token = property(lambda self: 0)  # constant: the state does not grow with the context
    used_bytes = property(lambda self: self.nbytes)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.t.values())

    def begin(self, tokens, lengths=None):
        return self._begin(tokens, lengths)

    def rollback(self, pos) -> None:
        new = as_positions(pos, self.batch_size)
        for b in range(self.batch_size):
            p = int(new[b])
            if p == int(self.pos[b]):
                continue
            if p != 0:
                raise AttnlabError(f"a {type(self).__name__} at position {int(self.pos[b])} cannot roll back to "
                                   f"{p}: it keeps no history; clone it before the tokens you may want to undo")
            for t in self.t.values():
                t[:, b].zero_()
        self.pos = new

    def clone(self):
        return type(self)({k: t.clone() for k, t in self.t.items()}, self.pos.clone())

    def add_sequence(self) -> int:
        self.extend(type(self)({k: t.new_zeros((t.shape[0], 1) + t.shape[2:]) for k, t in self.t.items()}))
        return self.batch_size - 1

    def take(self, rows):
        rows = list(rows)
        gone = set(rows)
        keep = [r for r in range(self.batch_size) if r not in gone]
        out = type(self)({k: t[:, rows] for k, t in self.t.items()}, self.pos[rows].clone())
        self.t = {k: t[:, keep] for k, t in self.t.items()}
        self.pos = self.pos[keep]
        return out

    def release(self, row: int) -> None:
        self.take([row])

    def extend(self, other) -> None:
        if self.batch_size == 0:  # adopt the other's tensors: no copy
            self.t, self.pos = other.t, other.pos
            return
        self.t = {k: torch.cat([t, other.t[k]], dim=1) for k, t in self.t.items()}
        self.pos = torch.cat([self.pos, other.pos])


class RecurrentState(FixedState):
    """Hidden vectors h (L, B, dim) and, for the LSTM, cell vectors c: the same bytes at any context length."""

"""Leave-one-out split (the protocol of SASRec and RecBole's sequential models).

Each user's history is already in stable time order (ties keep file order, data.py). For a history s of length n:

    training    s[:n-2]      the loss is taken at every position: inputs s[:-1] predict targets s[1:]
    validation  input s[:n-2], target s[n-2]
    test        input s[:n-1], target s[n-1]   (the test input includes the validation item)

Every input keeps only its last ``max_len`` items. A long training history is cut, from its end, into windows of
``max_len`` targets, so every training target is used exactly once per epoch and sees up to ``max_len`` items
before it (RecBole instead makes one example per prefix: n - 3 examples per user, 97,171 on ML-100K).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.recsys.data import Interactions


@dataclass
class EvalSet:
    """One leave-one-out evaluation: inputs right-padded with 0, the target after each, what each user has seen."""

    inputs: torch.Tensor  # (U, L) item ids, row u's first lengths[u] are real
    lengths: torch.Tensor  # (U,)
    targets: torch.Tensor  # (U,)
    seen: torch.Tensor  # (U, S) every item before the target (not truncated), 0-padded
    history_len: torch.Tensor  # (U,) items before the target, before truncation


@dataclass
class Split:
    n_items: int
    max_len: int
    train_windows: torch.Tensor  # (N, max_len + 1): inputs w[:, :-1], targets w[:, 1:], 0 = padding
    train_sequences: list[list[int]]  # s[:-2] per user, for the counting baselines
    valid: EvalSet
    test: EvalSet

    @property
    def n_train_targets(self) -> int:
        return int((self.train_windows[:, 1:] != 0).sum())

    def describe(self) -> dict:
        return {"protocol": "leave-one-out; stable time sort (ties keep file order); test input includes the "
                            f"validation item; inputs truncated to the last {self.max_len}",
                "max_len": self.max_len, "train_windows": int(self.train_windows.shape[0]),
                "train_targets": self.n_train_targets, "users": int(self.test.targets.shape[0])}


def _pad(rows: list[list[int]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), max(1, width), dtype=torch.long)
    for r, row in enumerate(rows):
        out[r, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def _eval_set(histories: list[list[int]], targets: list[int], max_len: int) -> EvalSet:
    inputs = [h[-max_len:] for h in histories]
    return EvalSet(_pad(inputs, max_len), torch.tensor([len(i) for i in inputs]), torch.tensor(targets),
                   _pad(histories, max(map(len, histories))), torch.tensor([len(h) for h in histories]))


def train_windows(seq: list[int], max_len: int) -> list[list[int]]:
    """Windows of at most max_len + 1 items covering every target seq[1:] once, cut from the end."""
    out = []
    for end in range(len(seq), 1, -max_len):
        start = max(1, end - max_len)  # targets seq[start:end], inputs seq[start - 1:end - 1]
        out.append(seq[start - 1:end])
    return out


def shifted_windows(seq: list[int], max_len: int, shift: int) -> tuple[list[list[int]], list[int]]:
    """Windows whose cuts sit ``shift`` targets earlier than train_windows' (0 <= shift < max_len), each with the
    number of its leading targets that are not scored. Every target seq[1:] is still scored once, but the newest
    ``shift`` targets get a window of their own that keeps up to max_len items of context before them, and every other
    target sees a different amount of history than under the fixed cuts. A new shift each epoch means a target is not
    always predicted from the same prefix length (the fixed cuts show the first target of each window one item only)."""
    ends = ([len(seq)] if shift else []) + list(range(len(seq) - shift, 1, -max_len))
    windows, skips = [], []
    for i, end in enumerate(ends):
        first = max(1, ends[i + 1] if i + 1 < len(ends) else 1)  # this window scores targets seq[first:end]
        start = max(0, end - 1 - max_len)  # inputs seq[start:end - 1]: up to max_len items
        windows.append(seq[start:end])
        skips.append(first - 1 - start)  # targets seq[start + 1:first] were scored by the window before
    return windows, skips


def epoch_windows(sequences: list[list[int]], max_len: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, max_len + 1) windows for one epoch with a random shift per sequence, and (N,) unscored leading targets."""
    shifts = torch.randint(0, max_len, (len(sequences),), generator=gen).tolist()
    out = [shifted_windows(s, max_len, r) for s, r in zip(sequences, shifts)]
    windows = [w for ws, _ in out for w in ws]
    return _pad(windows, max_len + 1), torch.tensor([k for _, ks in out for k in ks], dtype=torch.long)


def leave_one_out(data: Interactions, max_len: int = 50) -> Split:
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    train = [s[:-2] for s in data.sequences]
    windows = [w for s in train for w in train_windows(s, max_len)]
    valid = _eval_set(train, [s[-2] for s in data.sequences], max_len)
    test = _eval_set([s[:-1] for s in data.sequences], [s[-1] for s in data.sequences], max_len)
    return Split(data.n_items, max_len, _pad(windows, max_len + 1), train, valid, test)

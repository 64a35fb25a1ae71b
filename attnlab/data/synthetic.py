"""Synthetic tasks with exact answers: ``copy`` and multi-query associative recall (``mqar``).

Both return (inputs, targets) of shape (B, T) where targets is -100 wherever nothing is asked, so
loss and accuracy count only the positions that test the skill.

- copy: random tokens, a separator, then the same tokens again; the model must reproduce the first half.
- mqar (Arora et al. 2023, "Zoology", arXiv 2312.04927): n_pairs key-value pairs are listed, then
  each key is asked again at a random later position; the answer is its value. Token 0 is filler.
  Keys come from the lower half of the vocabulary and values from the upper half, as in Zoology.
"""
from __future__ import annotations

import torch

from attnlab.errors import DataError

IGNORE = -100


def copy_batch(batch_size: int, seq_len: int, vocab: int, generator: torch.Generator):
    """Sequence: x_1..x_n SEP x_1..x_n with n = (seq_len) // 2; SEP is token 0, content in 1..vocab-1."""
    if vocab < 3:
        raise DataError(f"copy needs a vocabulary of at least 3 tokens, got {vocab}")
    n = seq_len // 2
    if n < 1:
        raise DataError(f"copy needs seq_len >= 2, got {seq_len}")
    content = torch.randint(1, vocab, (batch_size, n), generator=generator)
    seq = torch.cat([content, torch.zeros(batch_size, 1, dtype=torch.long), content], dim=1)  # (B, 2n+1)
    inputs, targets = seq[:, :-1].clone(), seq[:, 1:].clone()
    targets[:, : n] = IGNORE  # the first half is random: nothing to predict until the separator
    return inputs, targets


def mqar_batch(batch_size: int, seq_len: int, vocab: int, n_pairs: int, generator: torch.Generator,
               return_distance: bool = False):
    """Zoology's multi-query associative recall. Distance key->query is recorded when asked."""
    if vocab < 4 or n_pairs > (vocab // 2 - 1) or n_pairs > vocab - vocab // 2:
        raise DataError(f"mqar with n_pairs={n_pairs} needs vocab >= {2 * n_pairs + 2} "
                        f"(distinct keys and values), got {vocab}")
    context = 2 * n_pairs
    free = seq_len + 1 - context  # positions after the pairs, each query takes two (key, answer)
    if free < 2 * n_pairs:
        raise DataError(f"mqar with n_pairs={n_pairs} needs seq_len >= {4 * n_pairs - 1}, got {seq_len}")
    half = vocab // 2
    keys = torch.stack([torch.randperm(half - 1, generator=generator)[:n_pairs] + 1 for _ in range(batch_size)])
    values = torch.randint(half, vocab, (batch_size, n_pairs), generator=generator)
    seq = torch.zeros(batch_size, seq_len + 1, dtype=torch.long)
    seq[:, 0:context:2], seq[:, 1:context:2] = keys, values
    labels = torch.full_like(seq, IGNORE)
    distance = torch.full_like(seq, -1)
    slots = free // 2  # query slots of width 2 after the context
    for b in range(batch_size):
        chosen = torch.randperm(slots, generator=generator)[:n_pairs]
        order = torch.randperm(n_pairs, generator=generator)
        for slot, i in zip(chosen.tolist(), order.tolist()):
            q = context + 2 * slot
            seq[b, q] = keys[b, i]
            labels[b, q + 1] = values[b, i]
            distance[b, q + 1] = q - 2 * i  # from the key's first mention to its query
    inputs, targets = seq[:, :-1], labels[:, 1:]
    if return_distance:
        return inputs, targets, distance[:, 1:]
    return inputs, targets

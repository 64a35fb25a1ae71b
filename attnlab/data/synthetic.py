"""Synthetic tasks with exact answers: ``copy`` and multi-query associative recall (``mqar``).

Both return (inputs, targets) of shape (B, T) where targets is -100 wherever nothing is asked, so
loss and accuracy count only the positions that test the skill.

- copy: random tokens, a separator, then the same tokens again; the model must reproduce the first half.
- mqar (Arora et al. 2023, "Zoology", arXiv 2312.04927): n_pairs key-value pairs are listed, then
  each key is asked again at a random later position; the answer is its value. Token 0 is filler.
  Keys come from the lower half of the vocabulary and values from the upper half, as in Zoology.
- marked recall: one token follows a marker, d tokens of the same range later a query asks for it; the
  signal a recurrence must carry through d dependent steps, with nothing else to store.
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


def recall_vocab(vocab: int) -> tuple[range, range, range]:
    """The ranges of key, value and filler tokens in ``recall_batch``: three disjoint thirds of 1..vocab-1."""
    third = (vocab - 1) // 3
    return range(1, 1 + third), range(1 + third, 1 + 2 * third), range(1 + 2 * third, vocab)


def recall_batch(batch_size: int, seq_len: int, vocab: int, n_pairs: int, generator: torch.Generator,
                 filler: int | tuple[int, int] = 0, n_queries: int | None = None):
    """MQAR with queries back to back and irrelevant tokens in the context; returns (x, y, info).

    Sequence: the n_pairs "key value" bigrams, in random order, scattered among ``filler`` irrelevant tokens
    (an int, or a (lo, hi) range drawn per sequence), then queries: keys asked again, one per position, until
    seq_len (or ``n_queries`` of them). y holds the value at each query and IGNORE elsewhere. With queries
    back to back every position after the context is a labelled question, ~seq_len / n_pairs times more
    than Zoology's one query per pair, the same skill at a fraction of the compute.
    info: "distance" (B, T), query position minus its key's position (-1 where unlabelled); "value_pos"
    (B, T), where the asked value sits (-1 where unlabelled); "context_len" (B,).
    """
    keys_r, values_r, filler_r = recall_vocab(vocab)
    if n_pairs < 1 or n_pairs > len(keys_r):
        raise DataError(f"recall with n_pairs={n_pairs} needs vocab >= {3 * n_pairs + 1} (distinct keys), got {vocab}")
    lo, hi = (filler, filler) if isinstance(filler, int) else filler
    n_q = n_queries if n_queries is not None else seq_len - 2 * n_pairs - hi
    if n_q < 1 or 2 * n_pairs + hi + n_q > seq_len:
        raise DataError(f"recall with {n_pairs} pairs, up to {hi} filler tokens and {n_q} queries needs "
                        f"seq_len >= {2 * n_pairs + hi + max(n_q, 1)}, got {seq_len}")
    B, P, T = batch_size, n_pairs, seq_len
    keys = torch.rand(B, len(keys_r), generator=generator).argsort(1)[:, :P] + keys_r.start  # (B, P) distinct
    values = torch.randint(values_r.start, values_r.stop, (B, P), generator=generator)
    n_fill = torch.randint(lo, hi + 1, (B, 1), generator=generator)  # (B, 1)
    # Each pair sits at a cut point in 0..n_fill of the filler (sorted, repeats allowed): the j-th pair in
    # context order starts at cut_j + 2j.
    cuts = (torch.rand(B, P, generator=generator) * (n_fill + 1)).long().clamp(max=n_fill)
    sorted_cuts, order = cuts.sort(dim=1, stable=True)
    key_pos = torch.empty_like(cuts).scatter_(1, order, sorted_cuts + 2 * torch.arange(P))  # (B, P), per pair
    context_len = n_fill[:, 0] + 2 * P  # (B,)
    t = torch.arange(T).expand(B, T)
    x = torch.randint(filler_r.start, filler_r.stop, (B, T), generator=generator)
    x.scatter_(1, key_pos, keys)
    x.scatter_(1, key_pos + 1, values)
    asked = torch.randint(0, P, (B, T), generator=generator)
    query = (t >= context_len[:, None]) & (t < context_len[:, None] + n_q)
    x = torch.where(query, keys.gather(1, asked), x)
    x = torch.where(t >= context_len[:, None] + n_q, torch.zeros_like(x), x)  # the unused tail: filler 0
    y = torch.where(query, values.gather(1, asked), torch.full_like(x, IGNORE))
    asked_pos = key_pos.gather(1, asked)
    distance = torch.where(query, t - asked_pos, torch.full_like(x, -1))
    value_pos = torch.where(query, asked_pos + 1, torch.full_like(x, -1))
    return x, y, {"distance": distance, "value_pos": value_pos, "context_len": context_len}


MARK, QUERY = 1, 2  # marked_recall_batch's marker tokens; content is 3..vocab-1


def marked_recall_batch(batch_size: int, seq_len: int, vocab: int, generator: torch.Generator, n_queries: int = 8,
                        distance: int | None = None):
    """One marked token recalled at distance d among same-range tokens; returns (x, y, info).

    Sequence: content tokens drawn from 3..vocab-1; MARK at a random position p; the value is the content token
    at p + 1; every QUERY token asks for it (y holds the value there, IGNORE elsewhere). The tokens between the
    value and a query are drawn from the value's own range, so nothing but the marker singles the value out.
    Training (``distance`` None): p uniform over the sequence or (half the rows) over its first quarter, up
    to ``n_queries`` queries at random positions after the value. Test (``distance`` d): one query exactly d tokens
    after the value, p uniform where that fits.
    info: "distance" (B, T), query position minus the value's position (-1 where unlabelled).
    """
    B, T = batch_size, seq_len
    if vocab < 5:
        raise DataError(f"marked recall needs vocab >= 5 (two markers and content), got {vocab}")
    if T < 3:
        raise DataError(f"marked recall needs seq_len >= 3 (marker, value, query), got {T}")
    if distance is None and n_queries < 1:
        raise DataError(f"marked recall needs n_queries >= 1 (without a query, training has no label), "
                        f"got {n_queries}")
    if distance is not None and not 1 <= distance <= T - 2:
        raise DataError(f"marked recall at distance {distance} needs 1 <= distance <= seq_len - 2 = {T - 2}")
    rows = torch.arange(B)
    x = torch.randint(3, vocab, (B, T), generator=generator)
    last_mark = T - 3 if distance is None else T - 2 - distance  # inclusive: room for the value and a query
    p = torch.randint(0, last_mark + 1, (B,), generator=generator)
    if distance is None:
        # Half the marks in the first quarter: with marks uniform alone, a distance d needs p <= T - 2 - d and the
        # far distances would hardly be trained (d = T - 2 only from p = 0).
        early = torch.rand(B, generator=generator) < 0.5
        p = torch.where(early, torch.randint(0, T // 4 + 1, (B,), generator=generator), p)
    x[rows, p] = MARK
    value = x[rows, p + 1]
    t = torch.arange(T).expand(B, T)
    if distance is None:
        # n_queries random positions after the value: rank random keys, with every earlier position ranked last
        r = torch.rand(B, T, generator=generator).masked_fill(t <= (p + 1)[:, None], 2.0)
        r, at = r.sort(dim=1)
        asked = torch.zeros(B, T, dtype=torch.bool).scatter_(1, at[:, :n_queries], r[:, :n_queries] < 2.0)
    else:
        asked = t == (p + 1 + distance)[:, None]
    x = torch.where(asked, torch.full_like(x, QUERY), x)
    y = torch.where(asked, value[:, None].expand(B, T), torch.full_like(x, IGNORE))
    dist = torch.where(asked, t - (p + 1)[:, None], torch.full_like(x, -1))
    return x, y, {"distance": dist}

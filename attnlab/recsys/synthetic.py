"""Deterministic synthetic histories with long-range structure and short-range habits, and knobs for the mix.

Items fall into ``n_topics`` topics. Each user has ``tastes`` favourite topics (the latent taste) and one current
interest among them. At every step the next item is, with probability

    habit       the previous item's fixed successor (a short-range habit: first-order, a Markov chain learns it)
    long_range  an item from the current interest, which stays with probability ``stickiness`` and otherwise moves
                to another of the user's tastes: interests return after gaps, and which topics can return is only
                visible in the history, never in the previous item alone
    otherwise   a globally popular item (Zipf over all items)

So the share a first-order model cannot explain grows with ``long_range`` and with 1 - ``stickiness``; a model that
reads the whole history can recover the user's tastes, better the longer the history. Same arguments -> same data.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from attnlab.errors import DataError
from attnlab.recsys.data import Interactions


@dataclass(frozen=True)
class SyntheticConfig:
    n_users: int = 1000
    n_items: int = 800
    n_topics: int = 40
    tastes: int = 3
    min_len: int = 5
    max_len: int = 120  # history lengths are uniform in [min_len, max_len]
    habit: float = 0.15
    long_range: float = 0.75
    stickiness: float = 0.3
    zipf: float = 1.0  # popularity skew, within a topic and over all items
    seed: int = 0

    def __post_init__(self):
        if not (0 <= self.habit and 0 <= self.long_range and self.habit + self.long_range <= 1):
            raise DataError(f"habit={self.habit} and long_range={self.long_range} must be >= 0 and sum to <= 1")
        if not 0 <= self.stickiness <= 1:
            raise DataError(f"stickiness={self.stickiness} must be in [0, 1]")
        if self.min_len < 3 or self.max_len < self.min_len:
            raise DataError(f"history lengths [{self.min_len}, {self.max_len}]: need 3 <= min_len <= max_len")
        if self.n_items < self.n_topics or not 1 <= self.tastes <= self.n_topics:
            raise DataError(f"n_items={self.n_items}, n_topics={self.n_topics}, tastes={self.tastes}: need "
                            "n_items >= n_topics >= tastes >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


# Named mixes (``--data synthetic:NAME``): the default; one dominated by long-range tastes; one by habits.
SCENARIOS = {"default": {}, "long-range": {"habit": 0.05, "long_range": 0.9},
             "habits": {"habit": 0.6, "long_range": 0.3}}


def scenario(name: str) -> SyntheticConfig:
    if name not in SCENARIOS:
        raise DataError(f"synthetic:{name} is not known; choose one of: {', '.join(SCENARIOS)}")
    return SyntheticConfig(**SCENARIOS[name])


def _zipf(n: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** s
    return p / p.sum()


def generate(cfg: SyntheticConfig = SyntheticConfig()) -> Interactions:
    rng = np.random.default_rng(cfg.seed)
    items = rng.permutation(cfg.n_items) + 1  # ids 1..n_items, shuffled so topic and id are unrelated
    topics = np.array_split(items, cfg.n_topics)
    within = [np.cumsum(_zipf(len(t), cfg.zipf)) for t in topics]  # CDFs: one searchsorted per draw
    popular = np.cumsum(_zipf(cfg.n_items, cfg.zipf))
    popular_items = rng.permutation(cfg.n_items) + 1
    successor = rng.permutation(cfg.n_items) + 1  # habit: item i is followed by successor[i - 1]
    sequences = []
    for _ in range(cfg.n_users):
        tastes = rng.choice(cfg.n_topics, size=cfg.tastes, replace=False)
        interest = int(rng.integers(cfg.tastes))
        length = int(rng.integers(cfg.min_len, cfg.max_len + 1))
        seq = []
        for _ in range(length):
            u = rng.random()
            if seq and u < cfg.habit:
                seq.append(int(successor[seq[-1] - 1]))
                continue
            if u < cfg.habit + cfg.long_range:
                if cfg.tastes > 1 and rng.random() > cfg.stickiness:
                    interest = (interest + 1 + int(rng.integers(cfg.tastes - 1))) % cfg.tastes  # another taste
                t = tastes[interest]
                seq.append(int(topics[t][min(np.searchsorted(within[t], rng.random()), len(topics[t]) - 1)]))
            else:
                seq.append(int(popular_items[min(np.searchsorted(popular, rng.random()), cfg.n_items - 1)]))
        sequences.append(seq)
    name = f"synthetic(long_range={cfg.long_range}, habit={cfg.habit}, stickiness={cfg.stickiness}, seed={cfg.seed})"
    return Interactions(name, sequences, cfg.n_items, [str(u) for u in range(cfg.n_users)],
                        [str(i) for i in range(1, cfg.n_items + 1)])

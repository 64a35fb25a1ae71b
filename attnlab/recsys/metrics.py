"""HR@K and NDCG@K of a next-item prediction, under the three protocols reported side by side.

    full            rank the target among all items; already-seen items are ranked too (the default: RecBole
                    ranks seen items for sequential models, and a user may come back to an item)
    full_excl_seen  rank among all items except those before the target in the user's history
    sampled100      rank among the target and 100 negatives drawn uniformly without replacement from all other
                    items (never the target), SASRec's protocol; it flatters every model (Krichene & Rendle 2020)

rank = #items scored above the target + #other items scored equal (ties count against the model, so a constant
scorer gets no credit). HR@K = [rank < K]; NDCG@K = [rank < K] / log2(rank + 2) (one relevant item: IDCG = 1).
"""
from __future__ import annotations

import torch

K = 10
PROTOCOLS = ("full", "full_excl_seen", "sampled100")
N_NEGATIVES = 100


def rank_of_target(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """scores (U, C), targets (U,) column indices -> (U,) 0-based ranks, ties pessimistic."""
    t = scores.gather(1, targets[:, None])  # (U, 1)
    return (scores > t).sum(1) + (scores == t).sum(1) - 1


def hit_rate(ranks: torch.Tensor, k: int = K) -> torch.Tensor:
    return (ranks < k).float()


def ndcg(ranks: torch.Tensor, k: int = K) -> torch.Tensor:
    return torch.where(ranks < k, 1.0 / torch.log2(ranks.float() + 2.0), torch.zeros(()))


def exclude_seen(scores: torch.Tensor, seen: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """-inf at every seen item (seen (U, S), 0-padded) except the target itself."""
    out = scores.clone()
    out.scatter_(1, seen, float("-inf"))
    out.scatter_(1, targets[:, None], scores.gather(1, targets[:, None]))
    return out


def sample_negatives(targets: torch.Tensor, n_items: int, n: int = N_NEGATIVES,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """(U, n) distinct item ids in 1..n_items, uniform, never the row's target (random keys, the n smallest)."""
    if n > n_items - 1:
        raise ValueError(f"{n} negatives need at least {n + 1} items, have {n_items}")
    keys = torch.rand(targets.shape[0], n_items + 1, generator=generator)
    keys[:, 0] = 2.0  # padding is never drawn
    keys.scatter_(1, targets[:, None], 2.0)  # nor the target
    return keys.topk(n, dim=1, largest=False).indices


def sampled_ranks(scores: torch.Tensor, targets: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """Rank of the target among itself and its negatives (column 0 of the candidate list)."""
    cand = torch.cat([targets[:, None], negatives], dim=1)  # (U, 1 + n)
    return rank_of_target(scores.gather(1, cand), torch.zeros_like(targets))


def protocol_ranks(scores: torch.Tensor, targets: torch.Tensor, seen: torch.Tensor, negatives: torch.Tensor) -> dict:
    """Scores (U, n_items + 1) over all items (column 0 = padding) -> ranks under each protocol."""
    scores = scores.float().clone()
    scores[:, 0] = float("-inf")
    return {"full": rank_of_target(scores, targets),
            "full_excl_seen": rank_of_target(exclude_seen(scores, seen, targets), targets),
            "sampled100": sampled_ranks(scores, targets, negatives)}


def summarize(ranks: dict, k: int = K) -> dict:
    """{protocol: {"hr@10": x, "ndcg@10": y}} averaged over users."""
    return {p: {f"hr@{k}": float(hit_rate(r, k).mean()), f"ndcg@{k}": float(ndcg(r, k).mean())}
            for p, r in ranks.items()}

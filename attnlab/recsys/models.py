"""Next-item models, all keeping the project's contract ``logits, state = model(items, state=None)``,
items (B, T) -> logits (B, T, n_items + 1) (column 0 is padding), plus ``score_last(items, lengths)`` -> (B, n_items
+ 1): the scores after each row's last real item, which evaluation uses.

    sasrec   item embeddings + learned positions -> attnlab's causal backbone blocks (models/backbone.py, reused, not
             copied) -> scores against the same item embeddings (Kang & McAuley 2018). Parallel over T.
    gru4rec  item embeddings -> a GRU (torch's fused nn.GRU kernel) -> LayerNorm -> scores against the item embeddings
             (Hidasi et al. 2016). Sequential over T: the hidden vector is the state.
    markov   first-order transitions counted on the training histories, Dirichlet-smoothed towards popularity:
             P(j | i) = (c_ij + beta * p_j) / (c_i + beta), p_j = (c_j + 1) / (N + n_items). No gradient training.
    pop      log(count + 1) of each item in the training histories: the same scores for every user.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.backbone import Backbone
from attnlab.models.dropout import Dropout
from attnlab.models.fixed_state import RecurrentState
from attnlab.models.lm import check_tokens, last_positions
from attnlab.models.positional import build_positional
from attnlab.models.state import KVCache

MODELS = ("sasrec", "gru4rec", "markov", "pop")
NEURAL = ("sasrec", "gru4rec")


def _init(module: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """N(0, std) for matrices, residual output projections scaled by 1/sqrt(2 n_layers) (as lm.py), zero biases."""
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            scaled = name.endswith(("attn.wo.weight", "mlp.w2.weight"))
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers) if scaled else std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


class SASRec(nn.Module):
    def __init__(self, n_items: int, max_len: int = 50, dim: int = 64, n_layers: int = 2, n_heads: int = 2,
                 dropout: float = 0.2):
        super().__init__()
        self.cfg = ModelConfig(family="transformer", vocab_size=n_items + 1, dim=dim, n_layers=n_layers,
                               n_heads=n_heads, pos="learned", max_seq_len=max_len, dropout=dropout)
        self.item_emb = nn.Embedding(n_items + 1, dim)
        self.pos_enc = build_positional(self.cfg)
        self.dropout = Dropout(dropout)
        self.backbone = Backbone(self.cfg)
        _init(self, n_layers)

    def new_state(self, batch_size: int, max_len: int | None = None) -> KVCache:
        ref = self.item_emb.weight
        return KVCache.allocate(self.cfg.n_layers, batch_size, self.cfg.n_kv_heads, max_len or self.cfg.max_seq_len,
                                self.cfg.head_dim, dtype=ref.dtype, device=ref.device)

    def hidden(self, items: torch.Tensor, state=None) -> torch.Tensor:
        """items (B, T) -> (B, T, dim). Right padding needs no mask: a causal position never sees later filler."""
        B, T = check_tokens(items)
        positions = torch.arange(T, device=items.device) if state is None else state.begin(items, None)
        x = self.dropout(self.pos_enc.embed(self.item_emb(items), positions.to(items.device)))  # (B, T, dim)
        h = self.backbone(x, positions, self.pos_enc, state)
        if state is not None:
            state.commit()
        return h

    def forward(self, items: torch.Tensor, state=None):
        return self.hidden(items, state) @ self.item_emb.weight.t(), state  # (B, T, V): the shared embedding scores

    def score_last(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (last_positions(self.hidden(items), lengths) @ self.item_emb.weight.t())[:, 0]  # (B, V)


class GRU4Rec(nn.Module):
    def __init__(self, n_items: int, dim: int = 64, n_layers: int = 1, dropout: float = 0.2):
        super().__init__()
        self.n_layers, self.dim = n_layers, dim
        self.item_emb = nn.Embedding(n_items + 1, dim)
        self.dropout = Dropout(dropout)
        self.gru = nn.GRU(dim, dim, num_layers=n_layers, batch_first=True)  # torch's fused GRU kernel
        self.norm = nn.LayerNorm(dim)  # as the backbone's final norm: unit-scale outputs, so scores start moving
        _init(self, n_layers)
        for name, p in self.gru.named_parameters():  # recurrent weights: torch's default uniform init
            if name.startswith("weight"):
                nn.init.uniform_(p, -dim ** -0.5, dim ** -0.5)

    def new_state(self, batch_size: int, max_len: int | None = None) -> RecurrentState:
        """max_len is accepted for the shared contract and ignored: the state is one hidden vector per layer."""
        ref = self.item_emb.weight
        return RecurrentState({"h": torch.zeros(self.n_layers, batch_size, self.dim, dtype=ref.dtype, device=ref.device)})

    def hidden(self, items: torch.Tensor, state=None) -> torch.Tensor:
        B, T = check_tokens(items)
        h0 = None
        if state is not None:
            state.begin(items, None)
            h0 = state.t["h"]
        out, hn = self.gru(self.dropout(self.item_emb(items)), h0)  # (B, T, dim): T dependent steps inside
        if state is not None:
            state.t["h"].copy_(hn)
            state.commit()
        return self.norm(self.dropout(out))

    def forward(self, items: torch.Tensor, state=None):
        return self.hidden(items, state) @ self.item_emb.weight.t(), state

    def score_last(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return (last_positions(self.hidden(items), lengths) @ self.item_emb.weight.t())[:, 0]


class Pop(nn.Module):
    """Exact counts: log(c_j + 1), the same for every user and position."""

    def __init__(self, n_items: int, sequences: list[list[int]]):
        super().__init__()
        counts = torch.zeros(n_items + 1)
        for s in sequences:
            counts.index_add_(0, torch.tensor(s, dtype=torch.long), torch.ones(len(s)))
        self.register_buffer("counts", counts)

    def forward(self, items: torch.Tensor, state=None):
        B, T = check_tokens(items)
        return torch.log1p(self.counts).expand(B, T, -1), state

    def score_last(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.log1p(self.counts).expand(items.shape[0], -1)


class Markov(nn.Module):
    """First order: the previous item is the whole state, so ``state`` is passed through untouched."""

    def __init__(self, n_items: int, sequences: list[list[int]], beta: float = 1.0):
        super().__init__()
        prev = torch.tensor([a for s in sequences for a in s[:-1]], dtype=torch.long)
        nxt = torch.tensor([b for s in sequences for b in s[1:]], dtype=torch.long)
        V = n_items + 1
        self.transitions = torch.sparse_coo_tensor(torch.stack([prev, nxt]), torch.ones(len(prev)), (V, V),
                                                   check_invariants=True).coalesce()
        self.beta = beta
        self.pop = Pop(n_items, sequences)
        total = float(self.pop.counts.sum())
        self.prior = (self.pop.counts + 1) / (total + n_items)  # add-one popularity, p_j
        self.prior[0] = 0.0

    def counts_from(self, items: torch.Tensor) -> torch.Tensor:
        """(N,) previous items -> (N, V) transition counts c_ij."""
        return self.transitions.index_select(0, items.reshape(-1)).to_dense()

    def _log_prob(self, prev: torch.Tensor) -> torch.Tensor:
        c = self.counts_from(prev)  # (N, V)
        return torch.log((c + self.beta * self.prior) / (c.sum(1, keepdim=True) + self.beta))

    def forward(self, items: torch.Tensor, state=None):
        B, T = check_tokens(items)
        return self._log_prob(items.reshape(-1)).view(B, T, -1), state

    def score_last(self, items: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self._log_prob(items.gather(1, (lengths - 1)[:, None])[:, 0])


def build(name: str, n_items: int, max_len: int, train_sequences=None, **hp) -> nn.Module:
    if name == "sasrec":
        return SASRec(n_items, max_len, **hp)
    if name == "gru4rec":
        return GRU4Rec(n_items, **hp)
    if name == "markov":
        return Markov(n_items, train_sequences, **hp)
    if name == "pop":
        return Pop(n_items, train_sequences)
    raise ValueError(f"model {name!r} is not known; choose from: {', '.join(MODELS)}")

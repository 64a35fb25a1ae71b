"""Recurrent language models (tanh RNN, LSTM, GRU): the sequential baseline attention replaced.

The pass over T tokens is a genuine loop of T dependent steps: step t needs h_{t-1}. Only the input
projection W_ih x_t, which has no recurrence, is computed for all t at once. Parameters live in torch's
nn.RNN/LSTM/GRU modules, so the same weights can also run through torch's fused kernel
(``fused=True``) and the two paths are tested to agree. Gate layouts follow torch:
LSTM (i, f, g, o); GRU (r, z, n) with n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
"""
from __future__ import annotations

import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.fixed_state import RecurrentState
from attnlab.models.lm import check_tokens, last_positions

_MODULES = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def rnn_step(xw, h, w_hh, b_hh):
    return torch.tanh(xw + h @ w_hh.t() + b_hh)


def lstm_step(xw, h, c, w_hh, b_hh):
    i, f, g, o = (xw + h @ w_hh.t() + b_hh).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def gru_step(xw, h, w_hh, b_hh):
    x_r, x_z, x_n = xw.chunk(3, dim=-1)
    h_r, h_z, h_n = (h @ w_hh.t() + b_hh).chunk(3, dim=-1)
    r = torch.sigmoid(x_r + h_r)
    z = torch.sigmoid(x_z + h_z)
    n = torch.tanh(x_n + r * h_n)
    return (1 - z) * n + z * h


class RecurrentLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.kind = cfg.family
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.rnn = _MODULES[cfg.family](cfg.dim, cfg.dim, num_layers=cfg.n_layers, batch_first=True,
                                        dropout=cfg.dropout if cfg.n_layers > 1 else 0.0)
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.tok_emb.weight, 0.0, cfg.init_std)
        nn.init.normal_(self.head.weight, 0.0, cfg.init_std)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def tie_weights(self) -> None:
        if self.cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def rebuild_buffers(self) -> None:
        """No non-persistent buffers: nothing to rebuild after loading on the meta device."""

    @classmethod
    def upgrade_state_dict(cls, tensors: dict) -> dict:
        return tensors

    def new_state(self, batch_size: int, max_len: int | None = None, dtype=None, device=None, **_) -> RecurrentState:
        """max_len is accepted for the shared contract and ignored: the state has a fixed size."""
        ref = self.tok_emb.weight
        shape = (self.cfg.n_layers, batch_size, self.cfg.dim)
        kw = dict(dtype=dtype or ref.dtype, device=device or ref.device)
        tensors = {"h": torch.zeros(shape, **kw)}
        if self.kind == "lstm":
            tensors["c"] = torch.zeros(shape, **kw)
        return RecurrentState(tensors)

    def forward(self, tokens: torch.Tensor, state: RecurrentState | None = None, last_only: bool = False,
                lengths: torch.Tensor | None = None):
        B, T = check_tokens(tokens)
        x = self.tok_emb(tokens)  # (B, T, dim)
        hold = None  # (B, T) True on filler beyond a row's length, where the state must not change
        if state is None:
            if lengths is not None:
                raise ValueError("lengths needs a state: without one, pass rows of real tokens only")
            state_in = self.new_state(B)
        else:
            state_in = state
            state.begin(tokens, lengths)
            valid = state.valid_mask(tokens.device)
            hold = None if valid is None else ~valid
        if self.cfg.fused and hold is None:  # the fused kernel cannot skip filler: loop then
            x, h, c = self._fused(x, state_in)
        else:
            x, h, c = self._loop(x, state_in, hold)
        if state is not None:
            state.h.copy_(h)
            if c is not None:
                state.c.copy_(c)
            lengths = state.lengths
            state.commit()
        if last_only:
            x = last_positions(x, lengths)
        return self.head(self.norm(x)), state

    def _fused(self, x, state):
        hx = (state.t["h"], state.t["c"]) if self.kind == "lstm" else state.t["h"]
        out, hn = self.rnn(x, hx)
        if self.kind == "lstm":
            return out, hn[0], hn[1]
        return out, hn, None

    def _loop(self, x, state, hold=None):
        """Layer by layer, T dependent steps each: the sequential depth this family is known for."""
        hs, cs = [], []
        drop = self.rnn.dropout if self.training else 0.0
        for layer in range(self.cfg.n_layers):
            w_ih, w_hh = getattr(self.rnn, f"weight_ih_l{layer}"), getattr(self.rnn, f"weight_hh_l{layer}")
            b_ih, b_hh = getattr(self.rnn, f"bias_ih_l{layer}"), getattr(self.rnn, f"bias_hh_l{layer}")
            xw = x @ w_ih.t() + b_ih  # (B, T, gates*dim): no recurrence, so all T at once
            h = state.t["h"][layer]
            c = state.t["c"][layer] if self.kind == "lstm" else None
            outs = []
            # unbind, not xw[:, t]: each indexed read's backward writes a full (B, T, gates*dim) zero tensor, T^2
            # work in training (as in ssm.py); unbind's backward stacks the T gradients once.
            for t, xw_t in enumerate(xw.unbind(1)):  # the chain: step t cannot start before step t-1 ends
                h_prev, c_prev = h, c
                if self.kind == "lstm":
                    h, c = lstm_step(xw_t, h, c, w_hh, b_hh)
                elif self.kind == "gru":
                    h = gru_step(xw_t, h, w_hh, b_hh)
                else:
                    h = rnn_step(xw_t, h, w_hh, b_hh)
                if hold is not None:
                    keep = hold[:, t, None]
                    h = torch.where(keep, h_prev, h)
                    c = torch.where(keep, c_prev, c) if c is not None else None
                outs.append(h)
            x = torch.stack(outs, dim=1)  # (B, T, dim)
            if drop and layer < self.cfg.n_layers - 1:
                x = nn.functional.dropout(x, drop, training=True)
            hs.append(h)
            cs.append(c)
        return x, torch.stack(hs), (torch.stack(cs) if self.kind == "lstm" else None)

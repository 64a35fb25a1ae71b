"""The attention weights of a real forward pass: every attention layer's kernel call recorded (its queries, keys and
arguments), and the weights recomputed from them as the naive kernel computes them.

Why recomputed: the fast kernels (torch's SDPA, attnlab's compiled prefill, the flash tiles) never hold the T x S
matrix; the weights they apply are softmax(q k^T * scale + bias) under the same mask, which is what the naive
kernel materialises. tests/test_explain.py checks that these weights times the values give each kernel's own
output. Recording replaces each layer's kernel for the length of a ``recording`` block only (the compiled decode
step, which bypasses the kernel, is not used meanwhile), on a model nobody else runs at the same time.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from attnlab.errors import AttnlabError
from attnlab.models.attention import Attention, alibi_bias, build_mask
from attnlab.models.positional import Positional
from attnlab.models.sparse import default_block, pattern_mask


@dataclass
class Call:
    """One kernel call of one layer: q (B, H, T, D), k and v (B, Hkv, S, D), the kernel's output (B, H, T, D)."""

    layer: int
    kernel: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    args: dict = field(default_factory=dict)


def attention_layers(model) -> list[Attention]:
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    if not layers:
        family = getattr(getattr(model, "cfg", None), "family", "?")
        raise AttnlabError(f"this model ({family}) has no softmax attention layers: the attention views need a "
                           "transformer; a recurrent model (rnn, lstm, gru) has the recurrence view")
    return layers


@contextlib.contextmanager
def recording(model):
    """Yields a list that fills with a Call per attention kernel call while the block runs."""
    from attnlab.models.attention import KERNELS

    names = {fn: name for name, fn in KERNELS.items()}
    calls: list[Call] = []
    layers = attention_layers(model)
    originals = [m.kernel for m in layers]
    for m, kernel in zip(layers, originals):
        def recorded(q, k, v, *, _m=m, _kernel=kernel, **args):
            out = _kernel(q, k, v, **args)
            calls.append(Call(_m.layer_idx, names.get(_kernel, "?"), q.detach(), k.detach(), v.detach(),
                              out.detach(), args))
            return out
        m.kernel = recorded
    try:
        yield calls
    finally:
        for m, kernel in zip(layers, originals):
            m.kernel = kernel  # the same function object: the engine's `kernel is sdpa_attention` checks hold again


def logits(c: Call) -> torch.Tensor:
    """(B, H, T, S) fp32 scores q k^T * scale (+ ALiBi's bias), before any mask."""
    q, k = c.q.float(), c.k.float()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, H, S, D): grouped-query heads share kv heads
    scores = (q @ k.transpose(-2, -1)) * c.args["scale"]
    if c.args.get("alibi_slopes") is not None:
        scores = scores + alibi_bias(c.args["alibi_slopes"], q.shape[-2], k.shape[-2], c.args.get("q_pos"), q.device)
    return scores


def visible(c: Call) -> torch.Tensor | None:
    """The call's mask (True = visible), as its kernel applies it; None when every key is visible."""
    T, S, a = c.q.shape[-2], c.k.shape[-2], c.args
    if c.kernel == "block_sparse":  # the local + strided pattern, and a ragged row's end
        pattern = pattern_mask(T, S, a.get("q_pos"), a.get("block_size") or default_block(S), c.q.device)
        rows = build_mask(T, S, False, a.get("q_pos"), a.get("kv_len"), c.q.device)
        return pattern if rows is None else pattern & rows
    return build_mask(T, S, a["causal"], a.get("q_pos"), a.get("kv_len"), c.q.device, a.get("window"))


def weights(c: Call) -> torch.Tensor:
    """(B, H, T, S) fp32 attention weights of the call: softmax over the visible keys (a row that sees none: 0)."""
    scores, mask = logits(c), visible(c)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


@contextlib.contextmanager
def without_positions(model):
    """The model's positional encoding switched off (no embedding added, no rotation, no bias) inside the block."""
    kept = model.pos_enc
    model.pos_enc = Positional().to(next(model.parameters()).device)
    try:
        yield
    finally:
        model.pos_enc = kept


def prompt_calls(model, ids: list[int], positions: bool = True) -> list[Call]:
    """The calls of one forward pass over ``ids`` (batch 1, no cache), ordered by layer."""
    device = next(model.parameters()).device
    off = without_positions(model) if not positions else contextlib.nullcontext()
    with torch.inference_mode(), off, recording(model) as calls:
        model(torch.tensor([ids], device=device))
    return sorted(calls, key=lambda c: c.layer)


def prompt_weights(model, ids: list[int], positions: bool = True) -> torch.Tensor:
    """(L, H, T, T) attention weights of one forward pass over ``ids``."""
    return torch.stack([weights(c)[0] for c in prompt_calls(model, ids, positions)])

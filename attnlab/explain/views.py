"""The data behind each view of ``attnlab explain``, from the user's own model on this machine: JSON-ready dicts.

Every view pairs a picture with a measurement taken now: the prompt's prefill time, each decode step's time, the
prefill time at each grid size beside the cost model's prediction, the recurrence's forward time. Timings run the
model as the engine does (no recording); the weights come from a recorded pass of the same model (capture.py).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from attnlab.errors import AttnlabError
from attnlab.explain import capture
from attnlab.timing import time_calls

MAX_VIEW_TOKENS = 256  # a prompt's attention grid beyond this is too large to read (and to send) cell by cell
ROUND = 6  # significant digits of a weight sent to the page


@dataclass
class Explained:
    """The model a page explains, and how to read and write its tokens."""

    model: object
    tokenizer: object | None
    name: str

    @property
    def cfg(self):
        return self.model.cfg

    def encode(self, prompt: str, limit: int = MAX_VIEW_TOKENS) -> list[int]:
        if not isinstance(prompt, str) or not prompt:
            raise AttnlabError("type a prompt: the views need at least one token")
        if self.tokenizer is None:
            raise AttnlabError(f"{self.name} has no tokenizer (tokenizer.json): the views need one to read a prompt")
        ids = self.tokenizer.encode(prompt)
        cap = min(limit, self.cfg.max_seq_len) if not self.cfg.is_recurrent else limit
        if not ids:
            raise AttnlabError("the prompt encodes to no tokens: type some text")
        if len(ids) > cap:
            raise AttnlabError(f"the prompt is {len(ids)} tokens; these views show at most {cap} (the model's "
                               "context or the page's limit): shorten it")
        return ids

    def token_texts(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([i]).decode("utf-8", "replace") for i in ids]

    def facts(self) -> dict:
        c = self.cfg
        return {"name": self.name, "family": c.family, "layers": c.n_layers, "heads": getattr(c, "n_heads", None),
                "kv_heads": getattr(c, "n_kv_heads", None), "dim": c.dim, "max_seq_len": c.max_seq_len,
                "kernel": getattr(c, "kernel", None), "pos": getattr(c, "pos", None),
                "recurrent": bool(c.is_recurrent), "params": sum(p.numel() for p in self.model.parameters()),
                "max_view_tokens": MAX_VIEW_TOKENS}


def _r(x: float) -> float:
    return float(f"{x:.{ROUND}g}")


def _matrix(t: torch.Tensor) -> list[list[float]]:
    return [[_r(v) for v in row] for row in t.tolist()]


def _forward_s(model, ids: list[int], repeats: int = 3) -> dict:
    """Median wall seconds of a forward pass over ``ids`` (the prefill), no recording."""
    x = torch.tensor([ids], device=next(model.parameters()).device)
    with torch.inference_mode():
        t = time_calls(lambda: model(x, last_only=True), repeats, warmup=1)
    return {"median_s": t["median_s"], "min_s": t["min_s"], "max_s": t["max_s"], "repeats": repeats}


def entropy_bits(w: torch.Tensor) -> torch.Tensor:
    """Entropy in bits of each row of weights (..., S)."""
    return -(w * torch.log2(w.clamp_min(1e-30))).sum(-1)


def attention(ex: Explained, prompt: str, layer: int = 0, head: int = 0) -> dict:
    """One layer and head's T x T weights (row i: what token i attends to) and which cells its kernel lets a query
    see (``visible``: the causal mask, or a sliding window's band, or a sparse pattern), each row's entropy and
    largest weight for every layer and head, and the prompt's measured prefill time."""
    ids = ex.encode(prompt)
    calls = capture.prompt_calls(ex.model, ids)
    L, H = len(calls), calls[0].q.shape[1]
    if not (0 <= layer < L and 0 <= head < H):
        raise AttnlabError(f"layer {layer}, head {head}: this model has layers 0..{L - 1} and heads 0..{H - 1}")
    w = torch.stack([capture.weights(c)[0] for c in calls])  # (L, H, T, T)
    T = w.shape[-1]
    seen = capture.visible(calls[layer])
    seen = torch.ones(T, T, dtype=torch.bool) if seen is None else seen.reshape(-1, T, T)[0]  # (T, T)
    ent, top = entropy_bits(w), w.max(-1).values
    return {"tokens": ex.token_texts(ids), "ids": ids, "layers": L, "heads": H, "layer": layer, "head": head,
            "weights": _matrix(w[layer, head]), "visible": seen.int().tolist(),
            "entropy_bits": [[[_r(v) for v in h] for h in l] for l in ent.tolist()],
            "max_weight": [[[_r(v) for v in h] for h in l] for l in top.tolist()],
            "kernel": ex.cfg.kernel, "prefill": _forward_s(ex.model, ids)}


def budget(ex: Explained, prompt: str, filler: str = " and so on", steps: tuple[int, ...] = (0, 1, 2, 4, 8, 16)) -> dict:
    """How attention spreads: every row of the prompt (``rows``), and the last token's row as text is added: by
    prefix (the prompt's first n tokens) and with ``filler`` repeated 0..16 times before the last token. Per layer,
    averaged over heads: the row's entropy, its largest weight, and (with filler) the weight the last row still
    gives the prompt's own tokens."""
    ids = ex.encode(prompt)
    cap = ex.cfg.max_seq_len
    whole = capture.prompt_weights(ex.model, ids)  # (L, H, T, T)
    rows = {"entropy_bits": [[_r(v) for v in l] for l in entropy_bits(whole).mean(1).tolist()],  # (L, T)
            "max_weight": [[_r(v) for v in l] for l in whole.max(-1).values.mean(1).tolist()],
            "uniform_bits": [_r(math.log2(i + 1)) for i in range(len(ids))]}
    prefixes = sorted({n for n in (2, 4, 8, 16, 32, 64, 128, 256, len(ids)) if 2 <= n <= len(ids)})
    by_prefix = []
    for n in prefixes:
        w = capture.prompt_weights(ex.model, ids[:n])[:, :, -1]  # (L, H, n): the last token's row
        by_prefix.append({"tokens": n, "entropy_bits": [_r(v) for v in entropy_bits(w).mean(1).tolist()],
                          "max_weight": [_r(v) for v in w.max(-1).values.mean(1).tolist()],
                          "uniform_bits": _r(math.log2(n))})
    pad = ex.tokenizer.encode(filler) or ex.tokenizer.encode(" ")
    by_filler = []
    for k in steps:
        seq = ids[:-1] + pad * k + ids[-1:]
        if len(seq) > cap:
            break
        w = capture.prompt_weights(ex.model, seq)[:, :, -1]  # (L, H, S)
        own = torch.cat([w[..., :len(ids) - 1], w[..., -1:]], dim=-1).sum(-1)  # weight on the prompt's tokens
        by_filler.append({"inserted_tokens": k * len(pad), "tokens": len(seq),
                          "entropy_bits": [_r(v) for v in entropy_bits(w).mean(1).tolist()],
                          "max_weight": [_r(v) for v in w.max(-1).values.mean(1).tolist()],
                          "weight_on_prompt": [_r(v) for v in own.mean(1).tolist()]})
    return {"tokens": ex.token_texts(ids), "filler": filler, "rows": rows, "by_prefix": by_prefix,
            "by_filler": by_filler}


def grid(ex: Explained, lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512), seed: int = 0,
         predict=None) -> dict:
    """The n^2 grid: for each prompt length n (random tokens), the score cells every layer and head fills
    (n(n+1)/2 each, causal), the measured prefill time, and ``predict(n)`` (the cost model's seconds, or None)."""
    c = ex.cfg
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        if n > c.max_seq_len:
            break
        ids = torch.randint(0, c.vocab_size, (n,), generator=g).tolist()
        t = _forward_s(ex.model, ids)
        cells = n * (n + 1) // 2 * c.n_layers * c.n_heads
        rows.append({"tokens": n, "score_cells": cells, "prefill": t, "predicted_s": predict(n) if predict else None})
    return {"rows": rows, "layers": c.n_layers, "heads": c.n_heads}


def order(ex: Explained, prompt: str, seed: int = 0, layer: int = 0, head: int = 0) -> dict:
    """The same prompt shuffled, first layer, all keys visible (the mask would break the symmetry): with the
    model's positions the shuffled prompt's weights are not the permuted original's; without them they are, to
    rounding (self-attention is permutation-equivariant). For RoPE, the mean first-layer logit by relative distance,
    measured, beside the rotation's own dependence on distance (q = k = ones: the sum of cos(distance x theta_i))."""
    ids = ex.encode(prompt)
    if len(ids) < 3:
        raise AttnlabError("the order view needs a prompt of at least 3 tokens to shuffle")
    perm = list(range(len(ids)))
    random.Random(seed).shuffle(perm)
    shuffled = [ids[p] for p in perm]
    out = {"tokens": ex.token_texts(ids), "perm": perm, "layer": layer, "head": head}
    P = torch.tensor(perm)
    for key, pos in (("with_positions", True), ("without_positions", False)):
        a, b = (_all_keys(ex.model, x, pos, layer, head) for x in (ids, shuffled))
        permuted = a[P][:, P]  # row i of the shuffled prompt is token perm[i] of the original
        out[key] = {"original": _matrix(a), "shuffled": _matrix(b), "max_abs_difference": _r(float((b - permuted).abs().max()))}
    if getattr(ex.cfg, "pos", None) == "rope":
        call = capture.prompt_calls(ex.model, ids)[layer]
        lg = capture.logits(call)[0].mean(0)  # (T, T), heads averaged
        T = lg.shape[0]
        dist = list(range(T))
        measured = [_r(float(torch.diagonal(lg, -d).mean())) for d in dist]
        theta = ex.cfg.rope_theta ** (-torch.arange(0, ex.cfg.head_dim, 2).float() / ex.cfg.head_dim)
        analytic = [_r(float(torch.cos(d * theta).sum())) for d in dist]
        out["rope"] = {"distance": dist, "mean_logit": measured, "cos_sum": analytic}
    return out


def _all_keys(model, ids: list[int], positions: bool, layer: int, head: int) -> torch.Tensor:
    """(T, T) weights of one layer and head with every key visible."""
    c = capture.prompt_calls(model, ids, positions)[layer]
    return torch.softmax(capture.logits(c)[0, head], dim=-1)


def decode_steps(ex: Explained, prompt: str, new_tokens: int = 16):
    """Prefill vs decode, as events: first the prefill (the whole T x T grid at once, per layer and head), then one
    event per generated token (greedy) with the row it adds, read over the cached keys. Beside each, the engine's
    measured time for that step (a paged engine run of the same prompt, unrecorded, timed step by step) and the KV
    blocks it holds. The recorded run steps the model's own cache, one token at a time: the rows are what each
    decode step's one query computed over the keys cached so far."""
    ids = ex.encode(prompt)
    c = ex.cfg
    if len(ids) + 3 > c.max_seq_len:
        raise AttnlabError(f"the prompt fills the model's context ({c.max_seq_len} tokens): shorten it to decode")
    new_tokens = max(1, min(int(new_tokens), 64, c.max_seq_len - len(ids) - 2))
    # The engine's run takes two tokens more: its prefill yields the first token and each decode step feeds one in,
    # as each recorded step below does; one step more keeps the sequence (and its KV blocks) live past the last shown.
    timed = _engine_steps(ex.model, ids, new_tokens + 2)
    device = next(ex.model.parameters()).device
    state = ex.model.new_state(1, len(ids) + new_tokens)
    with torch.inference_mode(), capture.recording(ex.model) as calls:
        logits, _ = ex.model(torch.tensor([ids], device=device), state, last_only=True)
        T = len(ids)
        grid = torch.stack([capture.weights(k)[0, :, :, :T] for k in sorted(calls, key=lambda k: k.layer)])  # (L, H, T, T)
        yield {"phase": "prefill", "tokens": ex.token_texts(ids), "weights": [[_matrix(h) for h in l] for l in grid],
               "seconds": timed["prefill_s"], "kv_tokens": len(ids), "kv_blocks": timed["blocks"][0],
               "block_size": timed["block_size"]}
        for step in range(new_tokens):
            token = int(logits[0, -1].argmax())
            calls.clear()
            logits, _ = ex.model(torch.tensor([[token]], device=device), state, last_only=True)
            S = T + step + 1  # keys cached so far, the new one included (a cache's unused slots are cut off)
            rows = torch.stack([capture.weights(k)[0, :, -1, :S] for k in sorted(calls, key=lambda k: k.layer)])  # (L, H, S)
            yield {"phase": "decode", "step": step + 1, "token": ex.token_texts([token])[0], "id": token,
                   "row": [_matrix(l) for l in rows], "seconds": timed["step_s"][step] if step < len(timed["step_s"])
                   else None, "kv_tokens": S,
                   "kv_blocks": timed["blocks"][min(step + 1, len(timed["blocks"]) - 1)]}


def _engine_steps(model, ids: list[int], new_tokens: int) -> dict:
    """The engine on one prompt, paged, greedy: the prefill's seconds, each decode step's, and the KV blocks in use
    after each (one warm-up run first)."""
    import time

    from attnlab.engine.engine import Engine, EngineConfig
    from attnlab.engine.request import Request

    def run():
        engine = Engine(model, EngineConfig(max_batch=1, max_len=len(ids) + new_tokens, paged=True,
                                            prefix_reuse=False))
        engine.add(Request(list(ids), new_tokens))
        t = time.perf_counter()
        engine.step(decode=False)
        stamps, blocks = [time.perf_counter() - t], [engine.stats().get("kv_blocks_used", 0)]
        while engine.has_work:
            t = time.perf_counter()
            engine.step()
            stamps.append(time.perf_counter() - t)
            blocks.append(engine.stats().get("kv_blocks_used", 0))
        return stamps, blocks, engine.config.block_size

    with torch.inference_mode():
        run()
        stamps, blocks, size = run()
    return {"prefill_s": stamps[0], "step_s": stamps[1:], "blocks": blocks, "block_size": size}


def recurrence(ex: Explained, prompt: str) -> dict:
    """A recurrent model reads the prompt as a chain: the last layer's hidden state after each token (its norm, and
    how much it moved from the previous one), one dependent step per token per layer, and how far back a token's
    influence reaches: the gradient norm of the last position's top logit with respect to each input embedding.
    Beside it the forward's measured time."""
    if not ex.cfg.is_recurrent:
        raise AttnlabError(f"the recurrence view needs an rnn, lstm or gru checkpoint; this one is {ex.cfg.family}")
    ids = ex.encode(prompt)
    model, device = ex.model, next(ex.model.parameters()).device
    seen = {}
    hooks = [model.tok_emb.register_forward_hook(lambda m, i, o: seen.setdefault("emb", o)),
             model.norm.register_forward_hook(lambda m, i, o: seen.setdefault("hidden", i[0]))]
    try:
        with torch.enable_grad():
            logits, _ = model(torch.tensor([ids], device=device))
            emb_out, hidden = seen["emb"], seen["hidden"][0].detach()  # (1, T, d), (T, d)
            if emb_out.requires_grad:
                top = logits[0, -1].max()
                (grad,) = torch.autograd.grad(top, emb_out)
                influence = grad[0].norm(dim=-1)  # (T,)
            else:
                influence = None
    finally:
        for h in hooks:
            h.remove()
    norms = hidden.norm(dim=-1)
    moved = torch.cat([norms[:1], (hidden[1:] - hidden[:-1]).norm(dim=-1)])
    return {"tokens": ex.token_texts(ids), "family": ex.cfg.family, "layers": ex.cfg.n_layers,
            "state_norm": [_r(v) for v in norms.tolist()], "step_change": [_r(v) for v in moved.tolist()],
            "influence": None if influence is None else [_r(v) for v in influence.tolist()],
            "dependent_steps": len(ids) * ex.cfg.n_layers, "forward": _forward_s(model, ids)}

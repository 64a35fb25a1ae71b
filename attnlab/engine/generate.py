"""Generation for a batch of prompts, driving the ``Engine`` until every request is done.

    state = model.new_state(B, max_len)        # KV cache (written by index) or recurrent state
    logits = prefill(model, prompts, state)    # one parallel pass over every prompt token
    repeat: logits = decode_one_token(model, next_ids, state)   # one dependent step per token

``generate`` adds every prompt to an ``Engine`` sized for exactly this batch and steps it until all are done:
the prompts, of any lengths, are prefilled in one ragged forward, then each step decodes every unfinished
sequence by one token, each at its own position. ``use_cache=False`` recomputes the whole text for every new
token, for comparison. Timings are what a user waits for (output.py): time-to-first-token (TTFT) runs from the
call until the first new token of every sequence exists; time per output token (TPOT) is the rest of the time
over the remaining steps.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from attnlab.engine.detok import TextStream
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.fast import inference
from attnlab.engine.output import GenerationOutput, finish_output
from attnlab.engine.request import Request, check_prompt
from attnlab.engine.request import Sequence as Seq
from attnlab.engine.sampling import SamplingParams, sample
from attnlab.errors import AttnlabError

def prefill(model, tokens: torch.Tensor, state, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Run the prompts (B, T) through the model in one pass; return each row's last real logits (B, V)."""
    logits, _ = model(tokens, state, last_only=True, lengths=lengths)
    return logits[:, -1]


def decode_one_token(model, ids: torch.Tensor, state) -> torch.Tensor:
    """Feed one token per sequence (B,); return next-token logits (B, V)."""
    logits, _ = model(ids[:, None], state)
    return logits[:, -1]


def generate(model, prompts: Sequence[Sequence[int]] | Sequence[int], max_new_tokens: int,
             params: SamplingParams | Sequence[SamplingParams] | None = None, stop_tokens=(), stop_strings=(),
             tokenizer=None, use_cache: bool = True, cache_dtype=None, truncate: str | None = None,
             paged: bool = False, proposer=None) -> GenerationOutput:
    """Generate for one prompt (a list of ids) or a batch (a list of lists). Returns completions + timings.

    ``params``: one sampling setting for every prompt, or one per prompt; each sequence draws from its own
    generator, seeded with its setting's seed. ``proposer`` (speculative.py) drafts tokens that each step
    verifies."""
    model = inference(model)
    if not prompts or isinstance(prompts[0], int):  # one prompt given as a flat list of ids
        prompts = [list(prompts)]
    per = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
    if len(per) != len(prompts):
        raise AttnlabError(f"{len(per)} sampling settings for {len(prompts)} prompts; give one, or one per prompt")
    t0 = time.perf_counter()
    prompts = [check_prompt(model, list(p), max_new_tokens, truncate) for p in prompts]  # before sizing the engine
    if not use_cache:
        return _generate_recomputing(model, prompts, max_new_tokens, per, stop_tokens, stop_strings, tokenizer)
    extra = proposer.k + 1 if proposer is not None else 0  # room for a verify pass's drafts
    # A one-shot batch has no later request to keep a state for; a paged pool still shares prefixes within it.
    config = EngineConfig(max_batch=len(prompts), max_len=batch_max_len(model, prompts, max_new_tokens) + extra,
                          paged=paged, cache_dtype=cache_dtype, prefix_reuse=paged)
    engine = Engine(model, config, tokenizer, proposer)
    ids = [engine.add(Request(list(p), max_new_tokens, q, stop_tokens, stop_strings, truncate=truncate))
           for p, q in zip(prompts, per)]
    results, stamps, state_bytes = {}, [], 0
    while engine.has_work:
        events = engine.step()
        if events:
            stamps.append(time.perf_counter() - t0)
            state_bytes = max(state_bytes, engine.state_bytes)
        results.update((e.id, e.result) for e in events if e.done)
    return finish_output([results[i] for i in ids], stamps, state_bytes, True, t0=t0)


def batch_max_len(model, prompts, max_new_tokens: int) -> int:
    """Tokens the longest sequence of a batch holds at its end (a prompt too long for the context is truncated,
    or refused, to fit it)."""
    n = max(len(p) for p in prompts) + max_new_tokens
    return n if model.cfg.is_recurrent else min(n, model.cfg.max_seq_len)


def _generate_recomputing(model, prompts, max_new_tokens, per, stop_tokens, stop_strings, tokenizer):
    """No cache: run the whole text so far through a fresh state for every new token (O(n) work per token)."""
    t0 = time.perf_counter()
    seqs = [Seq(p, max_new_tokens, q, TextStream(tokenizer, stop_strings, stop_tokens)) for p, q in zip(prompts, per)]
    for s in seqs:
        s.submitted, s.gen = t0, torch.Generator(device=next(model.parameters()).device).manual_seed(s.params.seed)
    stamps = []
    with torch.inference_mode():
        while not all(s.done for s in seqs):
            live = [s for s in seqs if not s.done]
            texts = [s.text for s in live]
            lengths = torch.tensor([len(t) for t in texts])
            T = int(lengths.max())
            tokens = torch.tensor([t + [0] * (T - len(t)) for t in texts], device=next(model.parameters()).device)
            logits = prefill(model, tokens, model.new_state(len(live), T), lengths)
            now = time.perf_counter() - t0
            for r, s in enumerate(live):
                seen = torch.tensor([s.text], device=logits.device) if s.params.repetition_penalty != 1.0 else None
                ids, lps = sample(logits[r:r + 1], s.params, s.gen, seen)
                s.append(int(ids[0]), float(lps[0]), now)
            stamps.append(now)
    results = [s.event().result for s in seqs]
    return finish_output(results, stamps, 0, False, t0=t0)


def sample_continuations(model, ids: torch.Tensor, n: int, prompt_len: int, new_tokens: int, seed: int = 0,
                         batch: int = 32, params: SamplingParams | None = None) -> list[list[int]]:
    """n prompts of prompt_len tokens drawn at random from ``ids`` (seeded), each followed by the model's
    continuation of new_tokens under ``params`` (greedy by default): the text a draft distilled from this model will
    be asked to predict. The prompts share one length, so `batch` of them decode together with no padding (a batch
    of decode steps costs little more than one: the weights are read once for every row). Row i samples with seed
    ``params.seed + i``: rows draw independently, and batching changes nothing."""
    params = params or SamplingParams()
    starts = torch.randint(0, len(ids) - prompt_len - new_tokens, (n,),
                           generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for b in range(0, n, batch):
        prompts = [ids[s:s + prompt_len].tolist() for s in starts[b:b + batch]]
        per = [replace(params, seed=params.seed + b + i) for i in range(len(prompts))]
        out += [p + c.tokens for p, c in zip(prompts, generate(model, prompts, new_tokens, per).completions)]
    return out

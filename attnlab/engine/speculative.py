"""Speculative decoding: a cheap proposer drafts k tokens, the target checks them in ONE parallel pass.

Round (Leviathan et al. 2023; Chen et al. 2023), with p the target's and q the drafter's distribution:
  1. the drafter proposes d_1..d_k (k sequential cheap steps);
  2. the target runs [last, d_1..d_k] as one call with T = k+1, giving p_1..p_{k+1};
  3. d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection a token is drawn
     from norm(max(0, p_i - q_i)) and the round ends; if all k pass, a bonus token comes from p_{k+1}.
The output then follows the target's distribution exactly; with greedy decoding it is identical to
plain greedy decoding of the target. Rejected positions are undone by rolling the KV caches back.

Proposers: a small draft model (any transformer with the same vocabulary), or prompt lookup — the
continuation that followed the latest n-gram's previous occurrence in the text so far (a point-mass q).
"""
from __future__ import annotations

import time

import torch

from attnlab.engine.generate import (Completion, GenerationOutput, StopChecker, _finish, check_request,
                                     decode_one_token, prefill)
from attnlab.engine.sampling import SamplingParams, processed_probs
from attnlab.errors import AttnlabError


def _dist(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(N, V) logits -> (N, V) distribution actually sampled from (one-hot argmax when greedy)."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return processed_probs(logits, params)


def lookup_proposal(tokens: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_ngram..1) and propose
    the k tokens that followed it."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


class _DraftModel:
    """Keeps a draft model's KV cache in step with the accepted text."""

    def __init__(self, model, prompt: list[int], capacity: int, device):
        if model.cfg.is_recurrent:
            raise AttnlabError("the draft must be a transformer (its cache is rolled back after rejections)")
        self.model, self.device = model, device
        self.state = model.new_state(1, capacity)
        prefill(model, torch.tensor([prompt], device=device), self.state)

    def propose(self, pending: list[int], k: int, params: SamplingParams, gen) -> tuple[list[int], torch.Tensor]:
        logits = prefill(self.model, torch.tensor([pending], device=self.device), self.state)
        drafts, dists = [], []
        for i in range(k):
            q = _dist(logits, params)
            d = int(q.argmax(-1)) if params.greedy else int(torch.multinomial(q, 1, generator=gen))
            drafts.append(d)
            dists.append(q[0])
            if i < k - 1:
                logits = decode_one_token(self.model, torch.tensor([d], device=self.device), self.state)
        return drafts, torch.stack(dists)

    def sync(self, accepted_len: int) -> int:
        """Roll back to the accepted length; return how many accepted tokens it has not read yet."""
        keep = min(self.state.pos, accepted_len)
        self.state.rollback(keep)
        return accepted_len - keep


@torch.inference_mode()
def speculative_generate(target, prompt: list[int], max_new_tokens: int, k: int = 4, draft=None,
                         prompt_lookup: bool = False, params: SamplingParams | None = None, stop_tokens=(),
                         stop_strings=(), tokenizer=None, truncate: str | None = None) -> GenerationOutput:
    """Generate with a draft model (``draft=``) or prompt lookup (``prompt_lookup=True``); batch of one."""
    params = params or SamplingParams()
    if (draft is None) == (not prompt_lookup):
        raise AttnlabError("choose exactly one proposer: a draft model or prompt lookup")
    if k < 1:
        raise AttnlabError(f"k={k} draft tokens per round must be >= 1")
    if params.repetition_penalty != 1.0:
        raise AttnlabError("speculative decoding does not support a repetition penalty (it changes p per token)")
    if target.cfg.is_recurrent:
        raise AttnlabError("speculative decoding needs a transformer target (its KV cache is rolled back)")
    if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
        raise AttnlabError(f"the draft's vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                           f"({target.cfg.vocab_size}); use a draft trained with the same tokenizer")
    prompt = check_request(target, [prompt], max_new_tokens, truncate)[0]
    device = next(target.parameters()).device
    gen = torch.Generator(device=device).manual_seed(params.seed)
    stopper = StopChecker(stop_tokens, stop_strings, tokenizer)
    capacity = len(prompt) + max_new_tokens + k + 1
    comp = Completion(tokens=[], logprobs=[])
    stamps, rounds, proposed, accepted = [], 0, 0, 0
    t0 = time.perf_counter()
    state = target.new_state(1, capacity)
    logits = prefill(target, torch.tensor([prompt], device=device), state)
    drafter = _DraftModel(draft, prompt, capacity, device) if draft is not None else None
    p = _dist(logits, params)
    first = int(p.argmax(-1)) if params.greedy else int(torch.multinomial(p, 1, generator=gen))
    text = prompt + [first]
    comp.tokens.append(first)
    comp.logprobs.append(float(torch.log_softmax(logits.float(), -1)[0, first]))
    stamps.append(time.perf_counter() - t0)
    finished = stopper.done(comp.tokens)
    draft_pending = [first]
    while not finished and len(comp.tokens) < max_new_tokens:
        room = max_new_tokens - len(comp.tokens)
        n_draft = min(k, room - 1) if room > 1 else 0
        if drafter is not None and n_draft > 0:
            drafts, q = drafter.propose(draft_pending, n_draft, params, gen)
        else:
            drafts = lookup_proposal(text, n_draft) if n_draft > 0 else []
            q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), target.cfg.vocab_size).float() \
                .to(device) if drafts else None
        verify, _ = target(torch.tensor([[text[-1]] + drafts], device=device), state)  # (1, n+1, V): one pass
        p_all = _dist(verify[0], params)
        logp_all = torch.log_softmax(verify[0].float(), -1)
        new = []
        for i, d in enumerate(drafts):
            if params.greedy:
                ok = int(p_all[i].argmax()) == d
            else:
                ok = float(torch.rand((), generator=gen, device=device)) < min(1.0, float(p_all[i, d] / q[i, d]))
            if not ok:
                residual = (p_all[i] - q[i]).clamp(min=0)
                residual = residual / residual.sum() if residual.sum() > 0 else p_all[i]
                fix = int(residual.argmax()) if params.greedy else int(torch.multinomial(residual, 1, generator=gen))
                new.append((fix, i))
                break
            new.append((d, i))
            accepted += 1
        else:
            i = len(drafts)
            bonus = int(p_all[i].argmax()) if params.greedy else int(torch.multinomial(p_all[i], 1, generator=gen))
            new.append((bonus, i))
        rounds += 1
        proposed += len(drafts)
        now = time.perf_counter() - t0
        for tok, i in new:
            if len(comp.tokens) >= max_new_tokens or finished:
                break
            comp.tokens.append(tok)
            comp.logprobs.append(float(logp_all[i, tok]))
            stamps.append(now)
            text.append(tok)
            finished = stopper.done(comp.tokens)
        state.rollback(len(text) - 1)  # the cache keeps everything but the newest token
        if drafter is not None:
            behind = drafter.sync(len(text) - 1)
            draft_pending = text[len(text) - 1 - behind:]
    if finished:
        comp.finish_reason = "stop"
    out = _finish([comp], stamps, [prompt], stopper, tokenizer, state, True)
    out.stats.accepted = accepted / proposed if proposed else 0.0
    out.stats.rounds = rounds
    out.stats.proposed = proposed
    return out

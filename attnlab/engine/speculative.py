"""Speculative decoding: a cheap proposer drafts k tokens, the target checks them in ONE parallel pass.

Round (Leviathan et al. 2023; Chen et al. 2023), with p the target's and q the drafter's distribution:
  1. the drafter proposes d_1..d_k (k sequential cheap steps);
  2. the target runs [last, d_1..d_k] as one call with T = k+1, giving p_1..p_{k+1};
  3. d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection a token is drawn
     from norm(max(0, p_i - q_i)) and the round ends; if all k pass, a bonus token comes from p_{k+1}.
The output then follows the target's distribution exactly; with greedy decoding it is identical to
plain greedy decoding of the target. Rejected positions are undone by rolling the KV caches back.
"Identical" holds in fp32. With bf16 or int8 weights the (k+1)-row verify pass and the one-row decode step
run different kernels that round differently, so a near-tie between two tokens can flip (measured: 2 of 4
prompt-lookup settings on a 10.7M byte model diverged in bf16; none in fp32); a warning says so.

Proposers: a small draft model (any transformer with the same vocabulary), or prompt lookup — the
continuation that followed the latest n-gram's previous occurrence in the text so far (a point-mass q).
"""
from __future__ import annotations

import time
import warnings

import torch

from attnlab.engine.generate import (Completion, GenerationOutput, StopChecker, _finish, check_request,
                                     decode_one_token, prefill)
from attnlab.engine.sampling import SamplingParams, processed_probs
from attnlab.errors import AttnlabError


def _accept_sampled(drafts: list[int], q: torch.Tensor | None, p: torch.Tensor, vocab: int, gen) -> list[tuple]:
    """The accept/resample rule for drafts d_i ~ q_i against the target's p_i (rows of p, k+1 of them):
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from
    norm(max(0, p_i - q_i)); if all pass, a bonus token from p_k. q None = point masses on the drafts
    (prompt lookup). Returns [(token, row of p it came from)]."""
    if q is None and drafts:
        q = torch.nn.functional.one_hot(torch.tensor(drafts, dtype=torch.long), vocab).to(p)
    new = []
    for i, d in enumerate(drafts):
        if float(torch.rand((), generator=gen, device=p.device)) < min(1.0, float(p[i, d] / q[i, d])):
            new.append((d, i))
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        residual = residual / residual.sum() if residual.sum() > 0 else p[i]
        new.append((int(torch.multinomial(residual, 1, generator=gen)), i))
        return new
    i = len(drafts)
    new.append((int(torch.multinomial(p[i], 1, generator=gen)), i))
    return new


def lookup_proposal(tokens: list[int], k: int, max_ngram: int = 4, min_ngram: int = 1) -> list[int]:
    """Prompt lookup: find the earlier occurrence of the text's last n tokens with the longest n (up to
    max_ngram; the latest among equals) and propose the k tokens that followed it (continuing periodically
    where that runs into the end of the text); nothing when no earlier occurrence matches min_ngram tokens.
    A miss costs nothing (the round is a plain decode step), a poor match costs a wider verify pass, hence
    min_ngram > 1 for byte-level text, where single bytes recur."""
    n_tok = len(tokens)
    if n_tok < 2:
        return []
    last, best_n, best_start = tokens[-1], 0, -1
    for j in range(n_tok - 2, -1, -1):  # j: where an earlier occurrence of the tail would end
        if tokens[j] != last:
            continue
        n = 1
        while n < max_ngram and j - n >= 0 and tokens[j - n] == tokens[n_tok - 1 - n]:
            n += 1
        if n > best_n:
            best_n, best_start = n, j + 1
            if n == max_ngram:
                break
    if best_n < min_ngram:
        return []
    # Copy what followed, as an overlapping copy (LZ77-style): where the source runs into the text's end, the
    # copy continues from its own proposed tokens, so a run or a short loop ("____", "ababab") proposes all k
    # tokens instead of the one or two left before the end (measured: in a loop of one byte, 1 token a round).
    out: list[int] = []
    for i in range(k):
        src = best_start + i
        out.append(tokens[src] if src < n_tok else out[src - n_tok])
    return out


class _DraftModel:
    """Keeps a draft model's KV cache in step with the accepted text."""

    def __init__(self, model, prompt: list[int], capacity: int, device):
        if model.cfg.is_recurrent:
            raise AttnlabError("the draft must be a transformer (its cache is rolled back after rejections)")
        self.model, self.device = model, device
        self.state = model.new_state(1, capacity)
        prefill(model, torch.tensor([prompt], device=device), self.state)

    def propose(self, pending: list[int], k: int, params: SamplingParams, gen) -> tuple[list[int], torch.Tensor | None]:
        """k draft tokens and the (k, V) distributions they were drawn from (None when greedy: a point mass
        on each draft token, which the greedy check never needs)."""
        logits = prefill(self.model, torch.tensor([pending], device=self.device), self.state)
        drafts, dists = [], []
        for i in range(k):
            if params.greedy:
                d = int(logits.argmax(-1))
            else:
                q = processed_probs(logits, params)
                d = int(torch.multinomial(q, 1, generator=gen))
                dists.append(q[0])
            drafts.append(d)
            if i < k - 1:
                logits = decode_one_token(self.model, torch.tensor([d], device=self.device), self.state)
        return drafts, (torch.stack(dists) if dists else None)

    def sync(self, accepted_len: int) -> int:
        """Roll back to the accepted length; return how many accepted tokens it has not read yet."""
        keep = min(self.state.pos, accepted_len)
        self.state.rollback(keep)
        return accepted_len - keep


@torch.inference_mode()
def speculative_generate(target, prompt: list[int], max_new_tokens: int, k: int = 4, draft=None,
                         prompt_lookup: bool = False, params: SamplingParams | None = None, stop_tokens=(),
                         lookup_ngram: tuple[int, int] = (2, 4),
                         stop_strings=(), tokenizer=None, truncate: str | None = None) -> GenerationOutput:
    """Generate with a draft model (``draft=``) or prompt lookup (``prompt_lookup=True``, matching the last
    lookup_ngram = (min, max) tokens); batch of one."""
    params = params or SamplingParams()
    if (draft is None) == (not prompt_lookup):
        raise AttnlabError("choose exactly one proposer: a draft model or prompt lookup")
    if k < 1:
        raise AttnlabError(f"k={k} draft tokens per round must be >= 1")
    if not 1 <= lookup_ngram[0] <= lookup_ngram[1]:
        raise AttnlabError(f"lookup_ngram={lookup_ngram}: need 1 <= min <= max")
    if params.repetition_penalty != 1.0:
        raise AttnlabError("speculative decoding does not support a repetition penalty (it changes p per token)")
    if target.cfg.is_recurrent:
        raise AttnlabError("speculative decoding needs a transformer target (its KV cache is rolled back)")
    if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
        raise AttnlabError(f"the draft's vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                           f"({target.cfg.vocab_size}); use a draft trained with the same tokenizer")
    if getattr(target, "precision", "fp32") != "fp32":
        warnings.warn(f"speculative decoding with {target.precision} weights: the output follows the target's "
                      "distribution, but greedy output can differ from plain greedy decoding where two tokens "
                      "nearly tie (the verify pass and a decode step round differently); use fp32 for identical "
                      "output", stacklevel=2)
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
    first = int(logits.argmax(-1)) if params.greedy else \
        int(torch.multinomial(processed_probs(logits, params), 1, generator=gen))
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
            drafts, q = (lookup_proposal(text, n_draft, lookup_ngram[1], lookup_ngram[0]) if n_draft > 0 else []), None
        verify, _ = target(torch.tensor([[text[-1]] + drafts], device=device), state)  # (1, n+1, V): one pass
        logits_all = verify[0].float()
        if params.greedy:  # accept the longest prefix of drafts the target's argmax agrees with, plus one
            best = logits_all.argmax(-1).tolist()
            n_ok = next((i for i, d in enumerate(drafts) if best[i] != d), len(drafts))
            new = [(d, i) for i, d in enumerate(drafts[:n_ok])] + [(best[n_ok], n_ok)]
            accepted += n_ok
        else:
            new = _accept_sampled(drafts, q, processed_probs(logits_all, params), target.cfg.vocab_size, gen)
            accepted += len(new) - 1
        chosen = torch.tensor([[tok] for tok, _ in new], device=device)
        rows = logits_all[[i for _, i in new]]
        logp_new = (rows.gather(1, chosen) - torch.logsumexp(rows, -1, keepdim=True))[:, 0].tolist()
        new = [(tok, i, lp) for (tok, i), lp in zip(new, logp_new)]
        rounds += 1
        proposed += len(drafts)
        now = time.perf_counter() - t0
        for tok, _, lp in new:
            if len(comp.tokens) >= max_new_tokens or finished:
                break
            comp.tokens.append(tok)
            comp.logprobs.append(lp)
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

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
A proposer plugs into the engine's step (``Engine(..., proposer=)``; scheduler.py): it drafts for every running
sequence at once, the target verifies all of them in one ragged forward (row b: its newest token and its n_b
drafts), and each row keeps what it accepted; so speculative decoding runs on a batch like plain decoding does.
"""
from __future__ import annotations

import warnings

import torch

from attnlab.engine.fast import inference
from attnlab.engine.generate import GenerationOutput, batch_max_len, generate
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


def verify_drafts(drafts: list[int], q, logits: torch.Tensor, params: SamplingParams, gen) -> list[tuple]:
    """The target's verdict on one row's drafts, from its n+1 logit rows: [(token, row of logits)]. Greedy:
    the longest prefix of drafts the target's argmax agrees with, plus the target's own next token."""
    logits = logits.float()
    if params.greedy:
        best = logits.argmax(-1).tolist()
        n_ok = next((i for i, d in enumerate(drafts) if best[i] != d), len(drafts))
        return [(d, i) for i, d in enumerate(drafts[:n_ok])] + [(best[n_ok], n_ok)]
    return _accept_sampled(drafts, q, processed_probs(logits, params), logits.shape[-1], gen)


class LookupProposer:
    """Prompt lookup for every running sequence: k tokens copied from where the text's tail occurred before."""

    def __init__(self, k: int, ngram: tuple[int, int] = (2, 4)):
        self.k, self.ngram = k, ngram

    def joined(self, seqs) -> None: ...

    def release(self, row: int) -> None: ...

    def accepted(self, seqs) -> None: ...

    def propose(self, seqs):
        return [lookup_proposal(s.text, self.k, self.ngram[1], self.ngram[0]) for s in seqs], None

    def verify(self, seq, drafts, q, logits):
        return verify_drafts(drafts, q, logits, seq.params, seq.gen)


class DraftProposer:
    """A small draft model drafting for every running sequence in one batch; its state keeps one row per
    running sequence, in the scheduler's order, rolled back to the accepted text after every round."""

    def __init__(self, model, k: int, max_len: int):
        if model.cfg.family != "transformer" or model.cfg.kernel == "sliding":
            raise AttnlabError("the draft must be a softmax transformer without the sliding kernel (its cache is "
                               "rolled back after rejections)")
        self.model, self.k, self.max_len = inference(model), k, max_len
        self.device = next(model.parameters()).device
        self.state = self.model.new_state(0, max_len)

    def joined(self, seqs) -> None:
        for _ in seqs:  # new rows start empty: their first proposal feeds the whole text
            self.state.extend(self.model.new_state(1, self.max_len))

    def release(self, row: int) -> None:
        self.state.release(row)

    def propose(self, seqs):
        """Feed each row the text it has not read (ragged), then k-1 batched draft steps."""
        pending = [s.text[int(p):] for s, p in zip(seqs, self.state.pos)]
        lengths = torch.tensor([len(p) for p in pending])
        T = int(lengths.max())
        tokens = torch.tensor([p + [0] * (T - len(p)) for p in pending], device=self.device)
        logits, _ = self.model(tokens, self.state, last_only=True, lengths=lengths)
        logits = logits[:, -1]
        drafts, dists = [[] for _ in seqs], [[] for _ in seqs]
        sampled = not all(s.params.greedy for s in seqs)
        for i in range(self.k):
            for r, s in enumerate(seqs):
                if s.params.greedy:
                    d = int(logits[r].argmax(-1))
                else:
                    q = processed_probs(logits[r:r + 1], s.params)
                    d = int(torch.multinomial(q, 1, generator=s.gen))
                    dists[r].append(q[0])
                drafts[r].append(d)
            if i < self.k - 1:
                ids = torch.tensor([[d[-1]] for d in drafts], device=self.device)
                logits = self.model(ids, self.state)[0][:, -1]
        qs = [torch.stack(d) if d else None for d in dists] if sampled else None
        return drafts, qs

    def verify(self, seq, drafts, q, logits):
        return verify_drafts(drafts, None if q is None else q[:len(drafts)], logits, seq.params, seq.gen)

    def accepted(self, seqs) -> None:
        """Forget drafts the target rejected: keep at most the accepted text but its newest token."""
        keep = [min(int(p), len(s.text) - 1) for p, s in zip(self.state.pos, seqs)]
        self.state.rollback(keep)


def speculative_generate(target, prompt: list[int], max_new_tokens: int, k: int = 4, draft=None,
                         prompt_lookup: bool = False, params: SamplingParams | None = None, stop_tokens=(),
                         lookup_ngram: tuple[int, int] = (2, 4),
                         stop_strings=(), tokenizer=None, truncate: str | None = None) -> GenerationOutput:
    """Generate with a draft model (``draft=``) or prompt lookup (``prompt_lookup=True``, matching the last
    lookup_ngram = (min, max) tokens). One prompt (a list of ids) or a batch (a list of lists)."""
    prompts = [list(prompt)] if prompt and isinstance(prompt[0], int) else [list(p) for p in prompt]
    max_len = batch_max_len(target, prompts, max_new_tokens) + k + 1 if prompts else 0
    proposer = make_proposer(target, k, draft, prompt_lookup, lookup_ngram, max_len)
    out = generate(target, prompts, max_new_tokens, params, stop_tokens, stop_strings, tokenizer, truncate=truncate,
                   proposer=proposer)
    out.stats.accepted = out.stats.accepted or 0.0
    return out


def make_proposer(target, k: int, draft=None, prompt_lookup: bool = False, lookup_ngram=(2, 4),
                  max_len: int | None = None):
    """Check a speculative setting and build its proposer; a draft keeps rows of ``max_len`` tokens (by default
    the target's context). A request's own settings are checked by ``Engine.check``."""
    if (draft is None) == (not prompt_lookup):
        raise AttnlabError("choose exactly one proposer: a draft model or prompt lookup")
    if k < 1:
        raise AttnlabError(f"k={k} draft tokens per round must be >= 1")
    if not 1 <= lookup_ngram[0] <= lookup_ngram[1]:
        raise AttnlabError(f"lookup_ngram={lookup_ngram}: need 1 <= min <= max")
    for role, m in (("target", target), ("draft", draft)):
        if m is not None and (m.cfg.family != "transformer" or m.cfg.kernel == "sliding"):
            raise AttnlabError(f"speculative decoding needs a {role} whose KV cache can be rolled back: a softmax "
                               f"transformer without the sliding kernel (got family={m.cfg.family!r}, "
                               f"kernel={m.cfg.kernel!r})")
    if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
        raise AttnlabError(f"the draft's vocabulary ({draft.cfg.vocab_size}) differs from the target's "
                           f"({target.cfg.vocab_size}); use a draft trained with the same tokenizer")
    precision = inference(target).precision
    if precision != "fp32":
        warnings.warn(f"speculative decoding with {precision} weights: the output follows the target's "
                      "distribution, but greedy output can differ from plain greedy decoding where two tokens "
                      "nearly tie (the verify pass and a decode step round differently); use fp32 for identical "
                      "output", stacklevel=3)
    if draft is not None:
        return DraftProposer(draft, k, max_len or target.cfg.max_seq_len)
    return LookupProposer(k, lookup_ngram)

"""Speculative decoding: exact under greedy, the target's distribution under sampling (chi-square)."""
import pytest
import torch

from attnlab.engine import SamplingParams, generate
from attnlab.engine.speculative import lookup_proposal, speculative_generate
from attnlab.errors import AttnlabError
from attnlab.models import build_model
from conftest import tiny


def lively(seed, **kw):
    torch.manual_seed(seed)
    return build_model(tiny(tie_embeddings=False, init_std=0.2, max_seq_len=128, **kw)).eval()


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_speculative_equals_greedy_target(k):
    target, draft = lively(0, dim=64), lively(1, n_layers=1)
    prompt = [1, 2, 3, 4, 1, 2, 3]
    ref = generate(target, prompt, 40).tokens
    with_draft = speculative_generate(target, prompt, 40, k=k, draft=draft)
    lookup = speculative_generate(target, prompt, 40, k=k, prompt_lookup=True)
    assert with_draft.tokens == ref and lookup.tokens == ref
    assert with_draft.stats.accepted < 1.0  # a different random draft really is rejected sometimes
    self_draft = speculative_generate(target, prompt, 40, k=k, draft=target)
    assert self_draft.tokens == ref and self_draft.stats.accepted == 1.0  # a perfect draft is always accepted


def test_stop_tokens_inside_an_accepted_round():
    target = lively(0)
    ref = generate(target, [5, 6, 7], 30).tokens
    stop = ref[10]
    out = speculative_generate(target, [5, 6, 7], 30, k=4, draft=target, stop_tokens=[stop])
    assert out.tokens == ref[:ref.index(stop) + 1] and out.completions[0].finish_reason == "stop"


def test_lookup_proposal_copies_what_followed():
    assert lookup_proposal([1, 2, 3, 9, 9, 1, 2, 3], 2) == [9, 9]
    assert lookup_proposal([1, 2, 3], 2) == []
    assert lookup_proposal([4, 5, 4], 3) == [5, 4, 5]  # a loop continues as a loop
    assert lookup_proposal([3, 0, 0, 0], 4) == [0, 0, 0, 0]  # a run proposes k tokens, not the one left
    assert lookup_proposal([1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]
    # the longest matching tail wins over a later, shorter one; among equals the latest
    assert lookup_proposal([7, 8, 1, 2, 0, 5, 2, 6, 7, 8], 1) == [1]
    assert lookup_proposal([7, 8, 1, 7, 8, 2, 7, 8], 1) == [2]
    # below min_ngram matched tokens nothing is proposed (the round becomes a plain decode step)
    assert lookup_proposal([1, 2, 3, 9, 2], 2, min_ngram=2) == []
    assert lookup_proposal([1, 2, 3, 9, 1, 2], 2, min_ngram=2) == [3, 9]


def _chi2_pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


@pytest.mark.parametrize("proposer", ["draft", "lookup"])
def test_sampled_speculative_follows_the_target_distribution(proposer):
    """Token 2 (the first drafted one) must be distributed as sum_t1 p(t1) p(t2 | t1) under the target."""
    V = 8
    target = lively(0, vocab_size=V, dim=32)
    draft = lively(5, vocab_size=V, dim=16, n_layers=1)
    prompt = [1, 2, 3, 1, 2]  # lookup proposes "3" after "1 2", then "1 2 ..." : a real point-mass proposer
    params = dict(temperature=1.0, top_k=0)
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt]))[0][0, -1], -1)
        seqs = torch.tensor([prompt + [t] for t in range(V)])
        p2 = torch.softmax(target(seqs)[0][:, -1], -1)  # (V, V): row t1
    expected_dist = (p1[:, None] * p2).sum(0).double()
    n = 2500
    counts = torch.zeros(V, dtype=torch.float64)
    accepted = 0.0
    for seed in range(n):
        kw = dict(draft=draft) if proposer == "draft" else dict(prompt_lookup=True)
        out = speculative_generate(target, prompt, 3, k=2, params=SamplingParams(seed=seed, **params), **kw)
        counts[out.tokens[1]] += 1
        accepted += out.stats.accepted
    assert 0.0 < accepted / n < 1.0  # both branches (accept and resample) were exercised
    p = _chi2_pvalue(counts, expected_dist * n)
    assert p > 1e-3, f"chi-square p={p:.2e}: counts {counts.tolist()} vs expected {(expected_dist * n).tolist()}"
    # and the test has power: the draft's own distribution is rejected
    if proposer == "draft":
        with torch.no_grad():
            q1 = torch.softmax(draft(torch.tensor([prompt]))[0][0, -1], -1)
            q2 = torch.softmax(draft(seqs)[0][:, -1], -1)
        assert _chi2_pvalue(counts, (q1[:, None] * q2).sum(0).double() * n) < 1e-3


def test_speculative_errors():
    target = lively(0)
    with pytest.raises(AttnlabError, match=r"draft's vocabulary \(50\) differs from the target's \(37\)"):
        speculative_generate(target, [1, 2], 5, draft=lively(1, vocab_size=50))
    with pytest.raises(AttnlabError, match="exactly one proposer"):
        speculative_generate(target, [1, 2], 5)
    with pytest.raises(AttnlabError, match="transformer"):
        speculative_generate(target, [1, 2], 5, draft=lively(1, family="lstm"))


@pytest.mark.parametrize("proposer", ["draft", "lookup"])
def test_speculative_on_a_ragged_batch_keeps_greedy_output(proposer):
    """Three prompts of different lengths verified together (rows of k+1, ragged where drafts run short)."""
    target, draft = lively(0, dim=64), lively(1, n_layers=1)
    prompts = [[1, 2, 3, 4, 1, 2, 3], [9, 8], list(range(5, 30))]
    kw = dict(draft=draft) if proposer == "draft" else dict(prompt_lookup=True, lookup_ngram=(1, 3))
    out = speculative_generate(target, prompts, 30, k=3, **kw)
    assert [c.tokens for c in out.completions] == [generate(target, p, 30).tokens for p in prompts]
    assert out.stats.rounds > 0 and out.stats.proposed > 0
    assert set(out.stats.to_dict()) >= {"rounds", "proposed", "accepted"}


def test_a_sliding_window_target_or_draft_is_refused():
    sliding = lively(0, kernel="sliding", window=8)
    with pytest.raises(AttnlabError, match="rolled back"):
        speculative_generate(sliding, [1, 2, 3], 10, k=2, prompt_lookup=True)
    with pytest.raises(AttnlabError, match="rolled back"):
        speculative_generate(lively(0), [1, 2, 3], 10, k=2, draft=sliding)

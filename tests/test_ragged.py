"""One state per sequence: a ragged batch equals each sequence alone, for every kernel and family;
rollback and adding / releasing rows through the State interface; the log-sum-exp merge."""
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.models import build_model
from attnlab.models.flash import flash_attention, merge_attention
from attnlab.models.attention import KERNELS
from attnlab.models.state import State
from conftest import FAMILIES, KERNELS as KERNEL_NAMES, POSITIONS, tiny

CASES = ([dict(family="transformer", kernel=k, pos=p, window=6, block_size=4) for k in KERNEL_NAMES for p in POSITIONS]
         + [dict(family="transformer", n_kv_heads=2, mlp="swiglu", norm="rmsnorm")]
         + [dict(family=f) for f in FAMILIES[1:]])


def _ragged_vs_alone(model, paged: bool):
    """Prompts of 7, 3 and 11 tokens prefilled in one ragged forward, then 4 decode steps at three different
    positions, against each sequence run alone in one pass."""
    g = torch.Generator().manual_seed(0)
    lens = [7, 3, 11]
    seqs = [torch.randint(0, 37, (n + 4,), generator=g) for n in lens]
    with torch.no_grad():
        alone = [model(s[None])[0][0] for s in seqs]
        state = model.new_state(3, 32, paged=paged)
        tokens = torch.zeros(3, max(lens), dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, :lens[i]] = s[:lens[i]]
        out, _ = model(tokens, state, lengths=torch.tensor(lens))
        got = [[out[i, :lens[i]]] for i in range(3)]
        for t in range(4):
            step, _ = model(torch.stack([s[n + t] for s, n in zip(seqs, lens)])[:, None], state)
            for i in range(3):
                got[i].append(step[i])
    assert state.pos.tolist() == [n + 4 for n in lens]
    for g_i, a in zip(got, alone):
        torch.testing.assert_close(torch.cat(g_i), a, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_ragged_batch_equals_each_sequence_alone(kw):
    _ragged_vs_alone(build_model(tiny(**kw)).eval(), paged=False)


@pytest.mark.parametrize("kernel", ["naive", "sdpa", "flash", "block_sparse"])
@pytest.mark.parametrize("pos", ["rope", "alibi", "learned"])
def test_paged_ragged_batch_equals_each_sequence_alone(kernel, pos):
    _ragged_vs_alone(build_model(tiny(kernel=kernel, pos=pos, block_size=4)).eval(), paged=True)


@pytest.mark.parametrize("kw", CASES[:3] + CASES[-4:], ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_every_state_implements_the_protocol(kw):
    model = build_model(tiny(**kw))
    state = model.new_state(2, 16)
    assert isinstance(state, State)
    assert state.batch_size == 2 and state.pos.tolist() == [0, 0]
    row = state.add_sequence()
    assert row == 2 and state.batch_size == 3
    with torch.no_grad():
        model(torch.randint(0, 37, (3, 4)), state, lengths=torch.tensor([4, 2, 3]))
    assert state.pos.tolist() == [4, 2, 3]
    state.release(1)
    assert state.batch_size == 2 and state.pos.tolist() == [4, 3]
    moved = state.take([0])
    assert moved.pos.tolist() == [4] and state.pos.tolist() == [3]
    state.extend(moved)
    assert state.pos.tolist() == [3, 4]


def test_a_contiguous_cache_grown_row_by_row_keeps_every_row_and_never_writes_over_rows_it_gave_away():
    from attnlab.models.state import KVCache
    cache = KVCache.allocate(2, 0, 2, 8, 4)
    for i in range(5):  # rows added one at a time land in spare rows of doubling storage
        if cache._spare is not None and cache._spare[0].shape[0] > i:
            for t in cache._spare:
                t[i].fill_(float("nan"))  # the spare row as uninitialised storage may hold it
        assert cache.add_sequence() == i
        assert all(not t[i].any() for t in cache.k + cache.v)  # zeroed in place
        cache.k[1][i].fill_(i)
    assert [int(x) for x in cache.k[1][:, 0, 0, 0]] == [0, 1, 2, 3, 4]
    taken = cache.take([4])  # a view of the storage's row 4
    cache.add_sequence()  # must not land on the row just taken
    cache.k[1][4].fill_(9)
    assert int(taken.k[1][0, 0, 0, 0]) == 4
    cache.v[0] = cache.v[0].clone()  # rows replaced from outside while the storage has room: extend keeps them
    cache.v[0][0].fill_(7)
    cache.add_sequence()
    assert int(cache.v[0][0, 0, 0, 0]) == 7 and cache.v[0].shape[0] == 6
    cache.release(1)
    cache.add_sequence()
    assert [int(x) for x in cache.k[1][:, 0, 0, 0]] == [0, 2, 3, 9, 0, 0] and cache.v[0].shape[0] == 6
    assert cache.pos.tolist() == [0] * 6 and all(not t[5].any() for t in cache.k + cache.v)
    with pytest.raises(AttnlabError, match="cannot join a cache of 2 layers x \\(1, 8, 4\\)"):
        cache.extend(KVCache.allocate(2, 1, 1, 8, 4))  # one head against two


@pytest.mark.parametrize("paged", [False, True])
def test_per_sequence_rollback_then_rewrite_equals_a_clean_run(paged):
    model = build_model(tiny(block_size=4)).eval()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 37, (1, 12), generator=g), torch.randint(0, 37, (1, 12), generator=g)
    with torch.no_grad():
        state = model.new_state(2, 24, paged=paged)
        model(torch.cat([a[:, :10], b[:, :10]]), state)
        state.rollback([6, 10])  # row 0 forgets 4 tokens (a rejected draft), row 1 keeps all
        out, _ = model(torch.cat([a[:, 6:8], b[:, 10:12]]), state)
        ref_a, _ = model(a[:, :8])
        ref_b, _ = model(b)
    torch.testing.assert_close(out[0], ref_a[0, 6:8], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out[1], ref_b[0, 10:12], atol=1e-5, rtol=1e-4)


def test_fixed_states_roll_back_only_to_zero_per_row():
    from attnlab.errors import AttnlabError

    model = build_model(tiny(family="lstm"))
    state = model.new_state(2)
    with torch.no_grad():
        model(torch.randint(0, 37, (2, 5)), state)
    state.rollback([5, 0])
    assert state.pos.tolist() == [5, 0] and float(state.h[:, 1].abs().sum()) == 0.0
    assert float(state.h[:, 0].abs().sum()) > 0
    with pytest.raises(AttnlabError, match="cannot roll back to 3"):
        state.rollback([3, 0])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("split", [1, 13, 29])
def test_lse_merge_of_two_key_parts_equals_attention_over_all_keys(causal, split):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 9, 8, generator=g)
    k, v = torch.randn(2, 2, 30, 8, generator=g), torch.randn(2, 2, 30, 8, generator=g)
    kw = dict(causal=causal, alibi_slopes=None, scale=0.35)
    whole = KERNELS["naive"](q, k, v, **kw)
    q_pos = torch.arange(21, 30)[None].expand(2, -1)  # the queries are the last 9 of 30 positions
    out_a, lse_a = flash_attention(q, k[:, :, :split], v[:, :, :split], q_pos=q_pos, return_lse=True, **kw)
    # The second part's key j sits at position split + j: shift the queries instead of the keys.
    out_b, lse_b = flash_attention(q, k[:, :, split:], v[:, :, split:], q_pos=q_pos - split, return_lse=True, **kw)
    merged, lse = merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(merged, whole, atol=1e-5, rtol=1e-4)
    _, lse_whole = flash_attention(q, k, v, q_pos=q_pos, return_lse=True, **kw)
    torch.testing.assert_close(lse, lse_whole, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(out_a, whole, atol=1e-3)  # one part alone is not the answer


def test_lengths_bad_values_are_clear_errors():
    from attnlab.errors import AttnlabError

    model = build_model(tiny())
    state = model.new_state(2, 16)
    with pytest.raises(AttnlabError, match="lengths must be"):
        model(torch.randint(0, 37, (2, 4)), state, lengths=torch.tensor([0, 4]))
    with pytest.raises(AttnlabError, match="3 sequences|2 sequences"):
        model(torch.randint(0, 37, (3, 4)), state)


def test_a_new_head_reuses_the_backbone_without_copying_it():
    """A recommender-style head: item embeddings in, scores against the same embeddings out, the residual
    stack taken as it is (and still causal)."""
    from torch import nn

    from attnlab.models.backbone import Backbone
    from attnlab.models.positional import build_positional

    cfg = tiny(pos="learned")

    class ItemScorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.items = nn.Embedding(50, cfg.dim)
            self.pos_enc = build_positional(cfg)
            self.backbone = Backbone(cfg)

        def forward(self, seq):
            positions = torch.arange(seq.shape[1])
            h = self.backbone(self.pos_enc.embed(self.items(seq), positions), positions, self.pos_enc)
            return h @ self.items.weight.t()  # (B, T, n_items)

    model = ItemScorer().eval()
    seq = torch.randint(0, 50, (2, 9))
    scores = model(seq)
    changed = seq.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 50
    assert scores.shape == (2, 9, 50)
    torch.testing.assert_close(model(changed)[:, :6], scores[:, :6])
    assert sum(p.numel() for p in model.backbone.parameters()) > 0
    assert not any(n.startswith("backbone.") for n, _ in model.items.named_parameters())

"""The recall experiments (claims 3 and 8): the data, the fairness of the comparison, and every verdict's way out."""
import copy

import pytest
import torch

from attnlab.data.synthetic import IGNORE, MARK, QUERY, marked_recall_batch, recall_batch, recall_vocab
from attnlab.errors import DataError
from attnlab.experiments import recall
from attnlab.experiments.base import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED
from attnlab.experiments import e03_path_length as e03, e08_remedies as e08


def test_recall_batch_answers_every_query_from_its_own_context():
    x, y, info = recall_batch(16, 64, 64, 6, torch.Generator().manual_seed(0), filler=(0, 20))
    keys, values, filler = recall_vocab(64)
    for b in range(16):
        ctx = int(info["context_len"][b])
        pairs = {int(x[b, i]): int(x[b, i + 1]) for i in range(ctx - 1) if int(x[b, i]) in keys}
        assert len(pairs) == 6 and all(v in values for v in pairs.values())
        assert all(int(t) in filler for i, t in enumerate(x[b, :ctx]) if int(t) not in keys and int(t) not in values)
        for t in (y[b] != IGNORE).nonzero().flatten().tolist():
            assert t >= ctx and int(y[b, t]) == pairs[int(x[b, t])]
            assert int(x[b, info["value_pos"][b, t]]) == int(y[b, t])  # value_pos points at the answer
            assert int(x[b, t - info["distance"][b, t]]) == int(x[b, t])  # distance points back at the key


def test_recall_batch_rejects_what_does_not_fit():
    with pytest.raises(DataError, match="needs vocab"):
        recall_batch(1, 64, 16, 8, torch.Generator())
    with pytest.raises(DataError, match="needs seq_len"):
        recall_batch(1, 20, 64, 8, torch.Generator(), filler=8)


def test_marked_recall_asks_for_the_token_after_the_marker():
    x, y, info = marked_recall_batch(64, 32, 20, torch.Generator().manual_seed(0), n_queries=5)
    for b in range(64):
        p = int((x[b] == MARK).nonzero().flatten()[0])
        assert int((x[b] == MARK).sum()) == 1 and 3 <= int(x[b, p + 1]) < 20
        asked = (y[b] != IGNORE).nonzero().flatten().tolist()
        assert 1 <= len(asked) <= 5 and asked == (x[b] == QUERY).nonzero().flatten().tolist()
        for t in asked:
            assert t > p + 1 and int(y[b, t]) == int(x[b, p + 1]) and int(info["distance"][b, t]) == t - p - 1
    # the rest of the sequence is content of the value's own range: only the marker singles the value out
    assert bool(((x == MARK) | (x == QUERY) | ((x >= 3) & (x < 20))).all())
    for d in (1, 7, 30):
        x, y, info = marked_recall_batch(64, 32, 20, torch.Generator().manual_seed(1), distance=d)
        assert bool(((y != IGNORE).sum(1) == 1).all()) and set(info["distance"][y != IGNORE].tolist()) == {d}
        q = (y != IGNORE).nonzero()[:, 1]
        assert bool((x[torch.arange(64), q - d - 1] == MARK).all())


def test_marked_recall_rejects_what_does_not_fit():
    with pytest.raises(DataError, match="distance 31"):
        marked_recall_batch(1, 32, 20, torch.Generator(), distance=31)
    with pytest.raises(DataError, match="vocab >= 5"):
        marked_recall_batch(1, 32, 4, torch.Generator())
    with pytest.raises(DataError, match="n_queries >= 1"):
        marked_recall_batch(1, 32, 20, torch.Generator(), n_queries=0)


def test_marked_recall_trains_sweeps_and_tests_on_its_distance_axis(monkeypatch):
    """The marked task runs through the same sweep as MQAR: every rate trained, the test at each distance."""
    from dataclasses import replace
    quick = replace(recall.MARKED["quick"], steps=8, lrs=(1e-3, 3e-3))
    monkeypatch.setitem(recall.MARKED, "quick", quick)
    monkeypatch.setattr(recall, "_CACHE", {})
    recall.prefetch(["rnn"], "quick", "cpu", workers=1, task="marked")
    got = recall.trained("rnn", "quick", "cpu", task="marked")
    assert set(got["lr_sweep"]) >= {1e-3, 3e-3} and set(got["test"]) == set(quick.test_distances)
    assert all(0.0 <= s["acc"] <= 1.0 for accs in got["test"].values() for s in accs)
    assert ("mqar", "rnn", "quick", "cpu") not in recall._CACHE  # the tasks do not share models


def test_a_family_can_start_its_own_sweep_and_train_fewer_seeds(monkeypatch):
    """Setup.family_lrs and family_seeds: the family's sweep starts at its own rates, and its best rate is trained on
    its own number of seeds; the other families keep the shared ones."""
    from dataclasses import replace
    quick = replace(recall.SETUPS["quick"], steps=4, lrs=(1e-3,), seeds=2, test_pairs=(2,),
                    family_lrs=(("rnn", (3e-3, 1e-2)),), family_seeds=(("rnn", 1),))
    monkeypatch.setitem(recall.SETUPS, "quick", quick)
    monkeypatch.setattr(recall, "_CACHE", {})
    recall.prefetch(["rnn", "gru"], "quick", "cpu", workers=1)
    rnn, gru = recall.trained("rnn", "quick", "cpu"), recall.trained("gru", "quick", "cpu")
    assert set(rnn["lr_sweep"]) >= {3e-3, 1e-2} and 1e-3 not in rnn["lr_sweep"] and len(rnn["test"][2]) == 1
    assert set(gru["lr_sweep"]) == {1e-3} and len(gru["test"][2]) == 2
    assert quick.lrs_of("gru") == (1e-3,) and quick.seeds_of("gru") == 2


def test_a_family_whose_seed_0_misses_its_gate_trains_no_other_seed(monkeypatch):
    """Setup.seed_gates: the other seeds train only if seed 0, at its best rate, reaches the gate on the test draw at
    the smallest test point (the figure the claim's regime reads); a family without a gate trains every seed."""
    from dataclasses import replace
    quick = replace(recall.SETUPS["quick"], steps=2, lrs=(1e-3,), seeds=2, test_pairs=(2,),
                    seed_gates=(("rnn", 1.01), ("gru", 0.0)))
    monkeypatch.setitem(recall.SETUPS, "quick", quick)
    monkeypatch.setattr(recall, "_CACHE", {})
    recall.prefetch(["rnn", "gru", "lstm"], "quick", "cpu", workers=1)
    counts = {n: len(recall.trained(n, "quick", "cpu")["test"][2]) for n in ("rnn", "gru", "lstm")}
    assert counts == {"rnn": 1, "gru": 2, "lstm": 2}
    assert recall.SETUPS["quick"].gate_of("lstm") is None


def test_families_are_matched_within_ten_percent_with_equal_heads():
    for scale, setup in [*recall.SETUPS.items(), *recall.MARKED.items()]:
        target = recall.n_params(recall.build_model(recall.model_config("transformer", setup), "meta"))
        for name in recall.MODEL_FIELDS:
            cfg = recall.matched_config(name, setup)
            n = recall.n_params(recall.build_model(cfg, "meta"))
            assert abs(n / target - 1) <= 0.10, (scale, name, n, target)
            assert cfg.n_heads == setup.heads


def test_attention_maps_are_causal_distributions_that_reproduce_the_layer():
    setup = recall.with_steps("quick", 1)
    torch.manual_seed(0)
    model = recall.build_model(recall.model_config("transformer", setup), "cpu").eval()
    x, _, _ = recall_batch(2, 48, 64, 4, torch.Generator().manual_seed(0), filler=8)
    maps = recall.attention_maps(model, x)
    assert len(maps) == 2 and maps[0].shape == (2, 4, 48, 48)
    for a in maps:
        assert torch.allclose(a.sum(-1), torch.ones(2, 4, 48), atol=1e-5)
        assert float(a.triu(1).abs().max()) == 0.0
    # The rebuilt weights times v give what the kernel computed: swap the kernel for one that uses them.
    block = model.backbone.blocks[0]
    seen = {}
    block.attn.register_forward_hook(lambda m, a, out: seen.setdefault("out", out))
    model(x)
    h = block.attn_norm(model.pos_enc.embed(model.tok_emb(x), torch.arange(48)))
    H, D = block.attn.n_heads, block.attn.head_dim
    v = block.attn.wqkv(h)[..., 2 * H * D:].view(2, 48, H, D).transpose(1, 2)  # (B, H, T, D)
    mine = block.attn.wo((maps[0] @ v).transpose(1, 2).reshape(2, 48, H * D))
    assert torch.allclose(mine, seen["out"], atol=1e-5)


def test_the_quick_transformer_learns_recall_with_the_recipe():
    """The recipe is what makes recall learnable at CPU scale: the quick setup's transformer goes from chance
    (1/8 with 8 pairs) to >= 90% within 600 of its 800 steps (with the language-model defaults it stayed at
    chance for 2,000)."""
    setup = recall.with_steps("quick", 600)
    model = recall.train(recall.matched_config("transformer", setup), setup, 1e-3, 0, "cpu")
    assert recall.accuracy(model, setup, 8, 99, "cpu", n=128)["acc"] >= 0.9


def _rec(acc_top, acc_small=None, near=0.9, far=0.9, pairs=(4, 8)):
    """A fake recall summary: one accuracy per seed at each pair count."""
    small = acc_small if acc_small is not None else acc_top
    return {"test": {pairs[0]: [{"acc": a, "near": near, "far": far} for a in small],
                     pairs[1]: [{"acc": a, "near": near, "far": far} for a in acc_top]}}


def _e03():
    """A fake claim-3 measurement (its verdicts are tested in test_decide_parallel.py)."""
    grads = {f: [1.0, 1e-40] for f in e03.GRADIENT_FAMILIES}
    grads["transformer"] = [1.0, 0.5]
    cell = lambda near, far: {d: [{"acc": near if d == 1 else far}] * 3 for d in (1, 40)}
    rec = {f: {"test": cell(0.9, 0.1), "lr_sweep": {3e-4: 0.5, 1e-3: 0.6, 3e-3: 0.55}, "best_lr": 1e-3}
           for f in e03.RECALL_FAMILIES["full"]}
    rec["transformer"] = {"test": cell(1.0, 0.99), "lr_sweep": {3e-4: 0.5, 1e-3: 0.9, 3e-3: 0.55}, "best_lr": 1e-3}
    return {"grad_norms_by_seed": [grads] * 3, "recall": rec, "recall_setup": {"seq_len": 64}, "recall_task": "marked"}


def test_a_sweep_is_extended_until_it_brackets_its_best_rate():
    assert recall.next_rates({3e-4: 0.5, 1e-3: 0.6, 3e-3: 0.55}) == []  # bracketed
    assert recall.next_rates({3e-4: 0.5, 1e-3: 0.6, 3e-3: 0.7}) == pytest.approx([9e-3])  # best at the top: go up
    assert recall.next_rates({3e-4: 0.7, 1e-3: 0.6, 3e-3: 0.5}) == pytest.approx([9e-5])  # best at the bottom: one step (x1/3.3) down
    assert recall.next_rates({1e-3: 0.9}) == []  # one rate: no sweep to extend
    assert recall.bracketed({"0.0003": 0.5, "0.001": 0.6, "0.003": 0.55}, 1e-3)  # keys read back from JSON
    assert not recall.bracketed({3e-4: 0.5, 1e-3: 0.6, 3e-3: 0.7}, 3e-3)
    assert not recall.bracketed({1e-3: 0.9}, 1e-3)
    assert recall.best_rate({3e-4: 1.0, 1e-3: 1.0, 3e-3: 0.5}) == 1e-3  # a tie: the one inside the sweep


def _e08(tr=(0.95,), rem=(0.5,), exps=None, small_rem=(0.8, 0.8)):
    lens = [1024, 2048, 4096]
    exps = exps or {"sdpa": 2.0, "flash": 2.0, "sliding": 1.0, "block_sparse": 1.5, "linear": 1.0, "ssm": 1.0}
    rec = {f: _rec(rem, small_rem[:len(rem)]) for f in e08.REMEDIES}  # the remedies learned the small case
    rec["transformer"] = _rec(tr)
    return {"lengths": lens, "times_s": {k: [1e-3 * (T / 1024) ** e for T in lens] for k, e in exps.items()},
            "recall": rec}


def test_claim_8_verdicts():
    assert e08.decide(_e08()).verdict == SUPPORTED
    assert e08.decide(_e08(rem=(0.97,))).verdict == NOT_SUPPORTED
    slow = {"sdpa": 2.0, "flash": 2.0, "sliding": 2.2, "block_sparse": 1.5, "linear": 1.0, "ssm": 1.0}
    assert e08.decide(_e08(exps=slow)).verdict == NOT_SUPPORTED
    fault = {"sdpa": 2.0, "flash": 2.0, "sliding": 1.0, "block_sparse": 0.68, "linear": 1.0, "ssm": 1.0}
    assert e08.decide(_e08(exps=fault)).verdict == INCONCLUSIVE  # an O(n sqrt n) kernel cannot fit below 1
    assert e08.decide(_e08(tr=(0.3,), rem=(0.2,))).verdict == INCONCLUSIVE
    assert e08.decide(_e08(tr=(0.9, 0.5), rem=(0.6, 0.62))).verdict == INCONCLUSIVE
    assert e08.decide(_e08(small_rem=(0.3,))).verdict == INCONCLUSIVE  # the remedies never learned the small case
    quick = _e08()
    del quick["recall"]["block_sparse"]  # quick scale trains a subset
    assert e08.decide(quick).verdict == SUPPORTED


def test_decide_does_not_change_its_input():
    m = _e03()
    before = copy.deepcopy(m)
    e03.decide(m)
    assert m == before


def test_decide_reads_measurements_back_from_json():
    import json
    for mod, m in ((e03, _e03()), (e08, _e08())):
        assert mod.decide(json.loads(json.dumps(m))).verdict == mod.decide(m).verdict


def test_runs_side_by_side_in_workers_equal_runs_in_this_process(monkeypatch):
    """The sweep's worker processes (one thread each) train exactly what one thread trains here."""
    from dataclasses import replace
    monkeypatch.setitem(recall.SETUPS, "quick", replace(recall.SETUPS["quick"], steps=8, lrs=(1e-3, 3e-3)))
    monkeypatch.setattr(recall, "_CACHE", {})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        recall.prefetch(["transformer", "ssm"], "quick", "cpu", workers=1)
        here = {k: v for k, v in recall._CACHE.items()}
        recall._CACHE.clear()
        recall.prefetch(["transformer", "ssm"], "quick", "cpu", workers=2)
    finally:
        torch.set_num_threads(threads)
    for key, got in recall._CACHE.items():
        assert got["lr_sweep"] == here[key]["lr_sweep"] and got["best_lr"] == here[key]["best_lr"]
        for a, b in zip(got["models"], here[key]["models"]):
            for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
                assert torch.equal(x, y), name


def test_ssm_starts_with_mambas_step_sizes():
    """Delta = softplus(bias) starts in [1e-3, 1e-1]: with a zero bias (0.69) the state forgot within a token."""
    import torch.nn.functional as F
    from attnlab.config import ModelConfig
    from attnlab.models import build_model
    model = build_model(ModelConfig(family="ssm", pos="none", dim=32, n_layers=2, vocab_size=64, init_std=0.07), "cpu")
    for block in model.backbone.blocks:
        dt = F.softplus(block.attn.dt_up.bias.detach())
        assert 0.9e-3 <= float(dt.min()) and float(dt.max()) <= 0.11

"""Sequential recommendation: metrics by hand, the split's protocol, causal masking, the counting baselines, the
loaders and their errors, the ML-100K path on a wheel-shaped zip, and claim 18's verdicts."""
import math
import zipfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.errors import DataError
from attnlab.experiments.base import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED
from attnlab.recsys import metrics
from attnlab.recsys.data import Interactions, build_interactions, load_file
from attnlab.recsys.fetch import MEMBERS, download_wheel, load_ml100k
from attnlab.recsys.models import GRU4Rec, Markov, Pop, SASRec
from attnlab.recsys.split import leave_one_out, train_windows
from attnlab.recsys.synthetic import SyntheticConfig, generate


# --- metrics ------------------------------------------------------------------------------------------------------
def test_metrics_by_hand():
    scores = torch.tensor([[0.0, 0.9, 0.5, 0.1, 0.3],    # target 2: one item above -> rank 1
                           [0.0, 0.1, 0.2, 0.3, 0.4],    # target 4: rank 0
                           [0.0, 0.5, 0.5, 0.5, 0.1]])   # target 3 tied with two others -> rank 2 (pessimistic)
    targets = torch.tensor([2, 4, 3])
    ranks = metrics.rank_of_target(scores, targets)
    assert ranks.tolist() == [1, 0, 2]
    assert metrics.ndcg(ranks, 10).tolist() == pytest.approx([1 / math.log2(3), 1.0, 0.5])
    assert metrics.hit_rate(ranks, 2).tolist() == [1.0, 1.0, 0.0]
    assert metrics.ndcg(torch.tensor([10]), 10).item() == 0.0  # rank 10 is the 11th place: outside the top 10


def test_exclude_seen_and_protocols():
    scores = torch.tensor([[0.0, 0.9, 0.8, 0.1, 0.3]])
    seen = torch.tensor([[1, 0]])  # item 1 seen before; 0 is padding
    r = metrics.protocol_ranks(scores, torch.tensor([2]), seen, torch.tensor([[3, 4]]))
    assert r["full"].item() == 1 and r["full_excl_seen"].item() == 0 and r["sampled100"].item() == 0
    # the target is never excluded, even if seen before
    assert metrics.exclude_seen(scores, torch.tensor([[2, 1]]), torch.tensor([2]))[0, 2] == 0.8


def test_sampled_negatives_never_include_the_target():
    g = torch.Generator().manual_seed(0)
    targets = torch.randint(1, 151, (500,), generator=g)
    neg = metrics.sample_negatives(targets, 150, 100, g)
    assert neg.shape == (500, 100)
    assert not (neg == targets[:, None]).any() and not (neg == 0).any()
    assert all(len(set(row.tolist())) == 100 for row in neg)  # without replacement
    with pytest.raises(ValueError):
        metrics.sample_negatives(targets, 100, 100)


# --- split --------------------------------------------------------------------------------------------------------
def _inter(seqs, n_items):
    return Interactions("t", seqs, n_items, [str(i) for i in range(len(seqs))], [str(i) for i in range(1, n_items + 1)])


def test_split_has_no_leakage_and_truncates():
    data = generate(SyntheticConfig(n_users=60, n_items=80, n_topics=8, max_len=40, seed=3))
    sp = leave_one_out(data, max_len=7)
    for u, s in enumerate(data.sequences):
        assert sp.test.targets[u] == s[-1] and sp.valid.targets[u] == s[-2]
        n = int(sp.test.lengths[u])
        assert sp.test.inputs[u, :n].tolist() == s[:-1][-7:]  # test input ends with the validation item
        assert sp.valid.inputs[u, :int(sp.valid.lengths[u])].tolist() == s[:-2][-7:]
        assert sp.train_sequences[u] == s[:-2]
    # every training target appears once, and no window reaches the validation or test position
    flat = sorted(t for w in sp.train_windows.tolist() for t in w[1:] if t)
    assert flat == sorted(t for s in data.sequences for t in s[1:-2])
    assert sp.train_windows.shape[1] == 8
    assert train_windows([1, 2, 3, 4, 5, 6], 2) == [[4, 5, 6], [2, 3, 4], [1, 2]]


@given(n=st.integers(2, 60), max_len=st.integers(1, 9), shift=st.integers(0, 8))
@settings(max_examples=200, deadline=None)
def test_shifted_windows_score_every_target_once_with_full_context(n, max_len, shift):
    from attnlab.recsys.split import shifted_windows

    shift %= max_len
    seq = list(range(100, 100 + n))
    windows, skips = shifted_windows(seq, max_len, shift)
    scored = [t for w, k in zip(windows, skips) for t in w[1 + k:]]
    assert sorted(scored) == seq[1:]  # each target once per epoch, none lost or repeated
    for w, k in zip(windows, skips):
        assert len(w) <= max_len + 1 and 0 <= k < len(w) - 1
        assert w == seq[seq.index(w[0]):seq.index(w[0]) + len(w)]  # a contiguous piece of the history
        assert len(w) == max_len + 1 or w[0] == seq[0]  # context is cut only by max_len or the history's start
    if shift == 0:
        assert windows == train_windows(seq, max_len) and not any(skips)


def test_epoch_windows_shift_per_epoch_and_the_loss_skips_context_targets():
    import torch.nn.functional as F

    from attnlab.recsys.split import epoch_windows
    from attnlab.recsys.train import FitConfig, _loss

    seqs = [list(range(1, 30)), list(range(5, 12))]
    gen = torch.Generator().manual_seed(0)
    a, b = epoch_windows(seqs, 6, gen), epoch_windows(seqs, 6, gen)
    assert a[0].shape[1] == 7 and (a[0].shape != b[0].shape or not torch.equal(a[0], b[0]))
    torch.manual_seed(0)
    model = SASRec(40, max_len=6, dim=16, n_layers=1, n_heads=2, dropout=0.0)
    windows, skip = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 0, 0, 0, 0]]), torch.tensor([4, 0])
    logits, _ = model(windows[:, :-1])  # (B, T, V)
    targets = windows[:, 1:].clone()
    targets[0, :4] = 0  # row 0's first four targets are context only
    for smoothing in (0.0, 0.1):  # smoothing spreads over every item, as torch's label_smoothing does
        want = F.cross_entropy(logits.reshape(-1, 41), targets.reshape(-1), ignore_index=0, label_smoothing=smoothing)
        got = _loss(model, windows, FitConfig(label_smoothing=smoothing), 40, torch.Generator(), skip)
        assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_ema_keeps_the_averaged_weights():
    """With ema, the kept weights are the moving average, not the last step's weights."""
    from attnlab.recsys.train import FitConfig, fit

    data = generate(SyntheticConfig(n_users=40, n_items=120, n_topics=4, max_len=20, seed=1))
    sp = leave_one_out(data, max_len=8)
    torch.manual_seed(0)
    model = SASRec(sp.n_items, 8, dim=16, n_layers=1, n_heads=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    fit(model, sp, FitConfig(max_epochs=1, ema=0.999, shift_windows=True, seed=0))
    # 0.999 per step over a handful of steps moves the average about 1% of the way: far less than the raw weights
    moved = max((model.state_dict()[k] - v).abs().max().item() for k, v in start.items())
    torch.manual_seed(0)
    raw = SASRec(sp.n_items, 8, dim=16, n_layers=1, n_heads=2)
    fit(raw, sp, FitConfig(max_epochs=1, shift_windows=True, seed=0, ema=0.0))
    raw_moved = max((raw.state_dict()[k] - v).abs().max().item() for k, v in start.items())
    assert 0 < moved < 0.1 * raw_moved


def test_timestamp_ties_keep_file_order():
    rows = [("u", "a", 5.0, 1), ("u", "b", 1.0, 2), ("u", "c", 5.0, 3), ("u", "d", 5.0, 4), ("v", "a", 1, 5)]
    data = build_interactions(rows, "ties")
    assert [data.item_ids[i - 1] for i in data.sequences[0]] == ["b", "a", "c", "d"]
    sp = leave_one_out(data)
    assert data.item_ids[int(sp.test.targets[0]) - 1] == "d" and data.item_ids[int(sp.valid.targets[0]) - 1] == "c"
    assert data.dropped_users == 1  # v has one interaction


# --- models -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: SASRec(30, 12, dim=16, n_heads=2), lambda: GRU4Rec(30, dim=16)])
def test_future_items_never_change_past_scores(make):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randint(1, 31, (3, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(1, 31, (3, 5))
    with torch.no_grad():
        a, b = model(x)[0], model(y)[0]
        assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6) and not torch.allclose(a[:, 7:], b[:, 7:])
        state = model.new_state(3, 12)  # the contract's stateful path equals the full pass
        steps = torch.cat([model(x[:, :5], state)[0], model(x[:, 5:], state)[0]], dim=1)
        assert torch.allclose(steps, a, atol=1e-5)
        lengths = torch.tensor([12, 5, 1])
        assert torch.allclose(model.score_last(x, lengths), a[torch.arange(3), lengths - 1], atol=1e-5)


def test_sasrec_reuses_the_backbone_blocks():
    from attnlab.models.backbone import Backbone

    assert isinstance(SASRec(10, 5, dim=8, n_heads=2).backbone, Backbone)


def test_ce_loss_skips_padding_without_changing_its_value():
    """The loss scores only real positions; its value is the full-logits cross-entropy with padding ignored."""
    import torch.nn.functional as F

    from attnlab.recsys.train import FitConfig, _loss

    torch.manual_seed(0)
    model = SASRec(20, max_len=6, dim=16, n_layers=1, n_heads=2, dropout=0.0)
    windows = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 0, 0, 0, 0]])  # the second row is right-padded
    logits, _ = model(windows[:, :-1])  # (B, T, V)
    for smoothing in (0.0, FitConfig.label_smoothing):
        full = F.cross_entropy(logits.reshape(-1, 21), windows[:, 1:].reshape(-1), ignore_index=0,
                               label_smoothing=smoothing)
        got = _loss(model, windows, FitConfig(label_smoothing=smoothing), 20, torch.Generator())
        assert got.item() == pytest.approx(full.item(), rel=1e-5)


def test_lr_schedule_warms_up_then_decays_to_zero():
    from attnlab.recsys.train import FitConfig, lr_factor

    cos = FitConfig(max_epochs=4, warmup_epochs=1, schedule="cosine")
    f = [lr_factor(s, 10, cos) for s in range(40)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warm-up over the first epoch's 10 steps
    assert f[10] == pytest.approx(1.0) and all(a >= b for a, b in zip(f[10:], f[11:])) and f[-1] < 0.01
    lin = FitConfig(max_epochs=4, schedule="linear")
    assert lr_factor(20, 10, lin) == pytest.approx(0.5) and lr_factor(39, 10, lin) == pytest.approx(1 / 40)
    assert {lr_factor(s, 10, FitConfig(max_epochs=4)) for s in range(40)} == {1.0}  # constant, no warm-up
    with pytest.raises(ValueError, match="schedule"):
        FitConfig(schedule="step")
    with pytest.raises(ValueError, match="warmup_epochs"):
        FitConfig(max_epochs=2, warmup_epochs=2)


def test_markov_equals_counted_transitions():
    seqs = [[1, 2, 3, 2, 3], [2, 3, 1], [3, 2]]
    m = Markov(4, seqs, beta=0.5)
    counts = torch.zeros(5, 5)
    for s in seqs:
        for a, b in zip(s, s[1:]):
            counts[a, b] += 1
    assert torch.equal(m.counts_from(torch.arange(5)), counts)
    pop = torch.tensor([0, 2, 4, 4, 0.0])
    prior = (pop + 1) / (10 + 4)
    prior[0] = 0
    want = torch.log((counts[2] + 0.5 * prior) / (counts[2].sum() + 0.5))
    got = m.score_last(torch.tensor([[3, 2, 0]]), torch.tensor([2]))[0]
    assert torch.allclose(got, want)
    assert torch.equal(Pop(4, seqs).counts, pop)
    logits, state = m(torch.tensor([[1, 2]]))
    assert logits.shape == (1, 2, 5) and state is None


# --- loaders ------------------------------------------------------------------------------------------------------
FORMATS = {
    "x.inter": "user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + "".join(
        f"{u}\t{i}\t3\t{t}\n" for u, i, t in [(1, 10, 3), (1, 11, 1), (1, 12, 2), (2, 10, 1), (2, 12, 2), (2, 13, 3)]),
    "ratings.dat": "".join(f"{u}::{i}::3::{t}\n" for u, i, t in [(1, 10, 3), (1, 11, 1), (1, 12, 2), (2, 10, 1),
                                                                  (2, 12, 2), (2, 13, 3)]),
    "u.data": "".join(f"{u}\t{i}\t3\t{t}\n" for u, i, t in [(1, 10, 3), (1, 11, 1), (1, 12, 2), (2, 10, 1), (2, 12, 2),
                                                             (2, 13, 3)]),
    "ratings.csv": "userId,movieId,rating,timestamp\n" + "".join(
        f"{u},{i},3.5,{t}\n" for u, i, t in [(1, 10, 3), (1, 11, 1), (1, 12, 2), (2, 10, 1), (2, 12, 2), (2, 13, 3)]),
    "events.csv": "timestamp,user,item\n" + "".join(
        f"{t},{u},{i}\n" for u, i, t in [(1, 10, 3), (1, 11, 1), (1, 12, 2), (2, 10, 1), (2, 12, 2), (2, 13, 3)]),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_loaders(tmp_path, name):
    (tmp_path / name).write_text(FORMATS[name])
    d = load_file(tmp_path / name)
    assert d.n_users == 2 and d.n_items == 4
    assert [[d.item_ids[i - 1] for i in s] for s in d.sequences] == [["11", "12", "10"], ["10", "12", "13"]]


BAD = [("missing.inter", None, "no such file"),
       ("u.data", "1,10,3,5\n", "expected 4 tab-separated columns"),
       ("ratings.dat", "1::10::3\n", "expected 4 '::'-separated columns"),
       ("ratings.dat", "1::x10::3::5\n", "item id 'x10' is not an integer"),
       ("u.data", "1\t10\t3\tyesterday\n", "timestamp 'yesterday' is not a number"),
       ("x.inter", "user_id\titem_id\n1\t2\n", "not a RecBole typed field"),
       ("x.inter", "user_id:token\titem_id:token\ttimestamp:float\n1\t2\n", "expected 3 tab-separated columns"),
       ("x.csv", "a,b,c\n1,2,3\n", "has no column user, item, timestamp"),
       ("u.data", "1\t10\t3\t5\n1\t11\t3\t6\n2\t10\t3\t5\n", "no user has 3 or more interactions")]


@pytest.mark.parametrize("name,text,message", BAD)
def test_bad_input_names_file_line_and_fix(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(DataError, match=message) as e:
        load_file(path)
    assert str(path) in str(e.value)
    if text is not None and "no user" not in message:
        assert "line " in str(e.value) and ";" in str(e.value)  # where, then the fix


def test_ml100k_from_a_wheel_shaped_zip(tmp_path, monkeypatch):
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    rows = "".join(f"{u}\t{i}\t4\t{880000000 + 10 * u + i}\n" for u in range(1, 5) for i in range(1, 6))
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(MEMBERS["ml-100k"], "user_id:token\titem_id:token\trating:float\ttimestamp:float\n" + rows)
        z.writestr("recbole/__init__.py", "")
    d = load_ml100k(wheel)
    assert d.name == "ml-100k" and d.n_users == 4 and d.n_items == 5 and d.n_interactions == 20
    # the cache path: a wheel already there is used without running pip
    monkeypatch.setattr("subprocess.run", lambda *a, **k: pytest.fail("pip must not run when the wheel is cached"))
    assert download_wheel(tmp_path) == wheel
    with zipfile.ZipFile(tmp_path / "bad.whl", "w") as z:
        z.writestr("recbole/__init__.py", "")
    with pytest.raises(DataError, match="has no recbole/dataset_example"):
        load_ml100k(tmp_path / "bad.whl")


def test_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    import subprocess

    def fake_run(*a, **k):
        return subprocess.CompletedProcess(a, 1, "", "ERROR: Could not find a version that satisfies the requirement")
    monkeypatch.setattr("subprocess.run", fake_run)
    with pytest.raises(DataError, match="Is the package registry reachable"):
        download_wheel(tmp_path / "empty")


def test_synthetic_is_deterministic_and_has_its_knobs():
    a, b = generate(SyntheticConfig(n_users=20, seed=1)), generate(SyntheticConfig(n_users=20, seed=1))
    assert a.sequences == b.sequences
    assert generate(SyntheticConfig(n_users=20, seed=2)).sequences != a.sequences
    habits = generate(SyntheticConfig(n_users=20, habit=1.0, long_range=0.0))
    s = habits.sequences[0]
    assert len({(x, y) for x, y in zip(s, s[1:])}) == len(set(s[:-1]))  # a deterministic successor per item
    with pytest.raises(DataError):
        SyntheticConfig(habit=0.6, long_range=0.6)


# --- claim 18 end to end (its verdicts are tested in test_decide_habits.py) --------------------------------------
def test_claim_18_quick_runs(monkeypatch):
    """The quick scale end to end (synthetic, a few epochs), with a verdict, a table and a plot."""
    from attnlab.experiments import e18_recsys as e18

    monkeypatch.setitem(e18.SCALES, "quick", {**e18.SCALES["quick"], "seeds": 1, "max_epochs": 1,
                                              "synthetic": dict(n_users=80, n_items=150, n_topics=10, max_len=30)})
    out = e18.run("quick", "cpu")
    assert out.verdict in (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE) and out.plots and out.table
    assert out.data["source"] == "synthetic" and out.device == out.data["device"] == "cpu"
    assert out.repeats and out.regime  # one seed at quick scale, decided with its regime


def test_runs_made_elsewhere_are_used_and_hparams_reach_the_model(monkeypatch):
    """run_recsys takes runs made already (claim 18's training stage) as they are, and refuses runs made for another
    count of seeds, another seed or other users; ``hparams`` overrides reach the model built; without
    test_each_epoch only the kept epoch is tested."""
    from attnlab.recsys import run as run_mod
    from attnlab.recsys.train import FitConfig

    built = []
    real_build = run_mod.build
    monkeypatch.setattr(run_mod, "build", lambda *a, **kw: built.append(kw) or real_build(*a, **kw))
    data = generate(SyntheticConfig(n_users=40, n_items=120, n_topics=4, max_len=20, seed=1))
    fit = FitConfig(max_epochs=2, test_each_epoch=False)
    over = {"gru4rec": {"dropout": 0.0}}
    made = [run_mod.run_one("gru4rec", leave_one_out(data, 8), 0, fit, per_user=True, hparams=over)]
    assert built[-1]["dropout"] == 0.0 and built[-1]["dim"] == run_mod.HPARAMS["gru4rec"]["dim"]
    assert [h["test_ndcg"] for h in made[0]["history"]] == [None, None] and len(made[0]["user_ndcg"]) == 40
    n_built = len(built)
    out = run_mod.run_recsys(data, ("gru4rec", "pop"), 1, 8, fit, per_user=True, hparams=over, runs={"gru4rec": made})
    assert out["models"]["gru4rec"]["runs"] is made and len(built) == n_built + 1  # only pop was built
    assert out["hparams"]["gru4rec"]["dropout"] == 0.0 and out["hparams"]["sasrec"] == run_mod.HPARAMS["sasrec"]
    with pytest.raises(ValueError, match="1 runs given for 2 seed"):
        run_mod.run_recsys(data, ("gru4rec",), 2, 8, fit, runs={"gru4rec": made})
    with pytest.raises(ValueError, match="not with seed 0"):
        run_mod.run_recsys(data, ("gru4rec",), 1, 8, fit, runs={"gru4rec": [{**made[0], "seed": 1}]})
    other = generate(SyntheticConfig(n_users=30, n_items=120, n_topics=4, max_len=20, seed=1))
    with pytest.raises(ValueError, match="40 test users, this split has 30"):
        run_mod.run_recsys(other, ("gru4rec",), 1, 8, fit, per_user=True, runs={"gru4rec": made})


# --- end to end ---------------------------------------------------------------------------------------------------
def test_sasrec_beats_markov_on_long_range_histories():
    """Tastes that only the whole history reveals: attention reads it, a first-order chain cannot (a few seconds)."""
    from attnlab.recsys.run import run_one
    from attnlab.recsys.train import FitConfig

    data = generate(SyntheticConfig(n_users=200, n_items=150, n_topics=15, min_len=20, max_len=50, habit=0.05,
                                    long_range=0.9, seed=1))
    sp = leave_one_out(data, 50)
    sas = run_one("sasrec", sp, 0, FitConfig(max_epochs=6, patience=6))
    markov = run_one("markov", sp, 0, FitConfig())
    assert sas["metrics"]["full"]["ndcg@10"] > markov["metrics"]["full"]["ndcg@10"] + 0.02, (sas["metrics"],
                                                                                          markov["metrics"])


def test_cli_recsys_on_a_file(tmp_path, capsys):
    import json

    from attnlab.cli import main

    rows = [(u, (u * 7 + k * 3) % 120 + 1, k) for u in range(40) for k in range(6)]
    (tmp_path / "events.csv").write_text("user,item,timestamp\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    assert main(["recsys", "--data", str(tmp_path / "events.csv"), "--models", "markov,pop", "--seeds", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["models"]) == {"markov", "pop"} and "leave-one-out" in out["protocol"]
    assert set(out["models"]["pop"]["metrics"]) == {"full", "full_excl_seen", "sampled100"}
    assert main(["recsys", "--data", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["recsys", "--models", "sasrec,foo"]) == 2

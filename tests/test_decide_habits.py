"""decide() of claims 14-18 (facts in long prompts, splitting across devices, recommendation): each fed hand-made
measurements that must give "supported", "not supported" and "inconclusive", a failed regime check among them.
Pure Python: no model runs, no clock."""
from attnlab.experiments.base import INCONCLUSIVE, NOT_SUPPORTED, REGIME_NOT_REACHED, SUPPORTED, UNSTABLE
from decide_check import check


# --- claims 14-16: facts planted in real text (needle.py) --------------------------------------------------------
def _np(acc, tokens, facts, weight=0.5, n=200, depth=0.5):
    """One needle probe: one layer of two heads, the second the needle-attending one."""
    return {"acc": acc, "exact": acc, "n": n, "tokens": tokens, "facts": facts, "depth": depth, "weight": [[0.1, weight]],
            "weight_sd": [[0.05, 0.05]], "weight_n": 32, "distractor_weight": [[0.1, 0.1]]}


def _e14(*reps, facts=8, pair=0.9):
    """reps: (base acc, base weight, far acc, far weight) per repetition; ``pair``: accuracy beside one look-alike."""
    return {"train_len": 256, "max_facts": facts, "repeats": [
        {"head": [0, 1], "probes": [_np(a0, 64, 1, w0), _np(a0, 256, 1, w0), _np(pair, 256, 2, w0),
                                    _np(a1, 256, facts, w1), _np(0.1, 1024, facts, 0.1)]} for a0, w0, a1, w1 in reps]}


def test_e14():
    good, flat = (0.95, 0.6, 0.7, 0.3), (0.95, 0.6, 0.95, 0.6)
    check("e14_attention_budget", _e14(good, good, good), SUPPORTED)
    check("e14_attention_budget", _e14(flat, flat, flat), NOT_SUPPORTED)  # no dilution
    check("e14_attention_budget", _e14(*[(0.95, 0.6, 0.7, 0.6)] * 3), NOT_SUPPORTED)  # accuracy falls, weight does not
    check("e14_attention_budget", _e14(*[(0.95, 0.6, 0.89, 0.3)] * 3), INCONCLUSIVE)  # a fall at its margin
    out = check("e14_attention_budget", _e14(*[(0.5, 0.6, 0.2, 0.3)] * 3), INCONCLUSIVE)  # not learned
    assert out.qualifier == REGIME_NOT_REACHED
    assert check("e14_attention_budget", _e14(good, good, good, facts=3), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    # copies whichever fact it meets (a coin flip beside one look-alike): a fall is trivial, so no verdict
    assert check("e14_attention_budget", _e14(good, good, good, pair=0.5), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e14_attention_budget", _e14(good, flat, good), INCONCLUSIVE).qualifier == UNSTABLE


def _e15(*reps, facts=8, tokens=256, base=0.95, pair=0.9):
    return {"train_len": 256, "depths": [0, 0.25, 0.5, 0.75, 1], "repeats": [
        {"base": _np(base, 64, 1), "pair": _np(pair, 256, 2), "by_depth": [_np(a, tokens, facts, depth=d) for a, d in zip(accs, (0, .25, .5, .75, 1))]}
        for accs in reps]}


def test_e15():
    u, flat, recency = (0.8, 0.6, 0.5, 0.6, 0.99), (0.9, 0.9, 0.9, 0.9, 0.9), (0.5, 0.6, 0.7, 0.8, 0.95)
    check("e15_position", _e15(u, u, u), SUPPORTED)
    check("e15_position", _e15(flat, flat, flat), NOT_SUPPORTED)
    check("e15_position", _e15(recency, recency, recency), NOT_SUPPORTED)  # placement matters, but no U
    check("e15_position", _e15(*[(0.9, 0.82, 0.84, 0.83, 0.97)] * 3), INCONCLUSIVE)  # a gap at its margin
    assert check("e15_position", _e15(u, u, u, base=0.4), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e15_position", _e15(u, u, u, tokens=128), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e15_position", _e15(u, u, u, pair=0.55), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e15_position", _e15(u, flat, u), INCONCLUSIVE).qualifier == UNSTABLE


def _e16(*reps, base=0.95, facts=8, pair=0.9, padded=0.96):
    """reps: (short acc, long acc, short prefill s, long prefill s) per repetition; ``padded``: the control's
    accuracy (None: a run before the control)."""
    control = {} if padded is None else {"padded, no distractor": {**_np(padded, 256, 1), "prefill_s": [5e-3] * 5}}
    return {"batch": 32, "train_len": 256, "repeats": [
        {"base": _np(base, 64, 1), "pair": _np(pair, 256, 2), "kinds": {"relevant only": {**_np(a, 28, 1), "prefill_s": [t] * 5},
                                             "everything": {**_np(b, 256, facts), "prefill_s": [u] * 5}, **control}}
        for a, b, t, u in reps]}


def test_e16():
    good = (0.97, 0.9, 1e-3, 6e-3)
    check("e16_send_relevant", _e16(good, good, good), SUPPORTED)
    check("e16_send_relevant", _e16(*[(0.97, 0.9, 1e-3, 1.2e-3)] * 3), NOT_SUPPORTED)  # no dearer
    check("e16_send_relevant", _e16(*[(0.7, 0.95, 1e-3, 6e-3)] * 3), NOT_SUPPORTED)  # more context answers better
    noisy = {**_e16(good)["repeats"][0]}
    noisy["kinds"]["everything"]["prefill_s"] = [1.5e-3, 2.5e-3, 2e-3, 2.2e-3, 1.8e-3]
    check("e16_send_relevant", {"batch": 32, "train_len": 256, "repeats": [noisy]}, INCONCLUSIVE)  # ratio at 2x
    spiked = {**_e16(good)["repeats"][0]}  # one round's short prefill 3x slow: one ratio at 2x, the rest at 6x
    spiked["kinds"]["relevant only"]["prefill_s"] = [1e-3, 1e-3, 3e-3, 1e-3, 1e-3]
    check("e16_send_relevant", {"batch": 32, "train_len": 256, "repeats": [spiked]}, SUPPORTED)
    # the fact alone in a short context is what the claim compares: shown, not a regime condition, so a model that
    # fails short prompts is in the regime and refutes the claim
    check("e16_send_relevant", _e16(good, base=0.3), SUPPORTED)
    check("e16_send_relevant", _e16(*[(0.6, 0.9, 1e-3, 6e-3)] * 3, base=0.6, padded=0.97), NOT_SUPPORTED)
    assert check("e16_send_relevant", _e16(good, facts=2), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e16_send_relevant", _e16(good, pair=0.5), INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    assert check("e16_send_relevant", _e16(good, (0.7, 0.95, 1e-3, 6e-3), good), INCONCLUSIVE).qualifier == UNSTABLE
    # the padded control: the fact in plain corpus text at the trained length can answer better, and then refutes
    d = check("e16_send_relevant", _e16(good, good, good, padded=None), INCONCLUSIVE)  # a run without the control
    assert "no padded control" in " ".join(d.reasons)
    d = check("e16_send_relevant", _e16(*[(0.8, 0.75, 1e-3, 6e-3)] * 3, padded=0.99), NOT_SUPPORTED)
    assert "padded, no distractor better by more than 2 s.e." in " ".join(d.reasons)


# --- claim 17: attention and a linear recurrence split across devices, a nonlinear recurrence does not --------------
def _e17_side(P, ssm, lstm, attn=None, mem=None, comm=0.0):
    """One launch: three calls per part at the given ratio to 1.0, with a little spread (x 0.98, 1.0, 1.02)."""
    calls = lambda r: [r * f for f in (0.98, 1.0, 1.02)]  # noqa: E731
    side = {"processes": P, "ssm_s": calls(ssm), "lstm_s": calls(lstm),
            "lstm_whole_s": [1.0] * 3 if P > 1 else []}  # the whole sequence on rank 0, in the same launch
    if attn is not None:  # attention runs at 1 and 2 processes only
        side.update(attn_s=calls(attn), attn_peak_bytes=[mem * 100e6] * 3, comm_s=comm)
    return side


def _e17_round(attn=0.52, ssm4=0.55, lstm=1.02, mem=0.7, comm=0.01, ssm2=1.0, chunk=None, paired=False, one_ssm=1.0):
    """``chunk``: a rank's scan of its quarter at 4 processes, over the whole scan (None: a run before it was
    recorded); ``paired``: the whole scan also ran on rank 0 in the 2- and 4-process launches (at 1.0), while the
    1-process launch scanned at ``one_ssm``."""
    four, two = _e17_side(4, ssm4, lstm), _e17_side(2, ssm2, lstm, attn, mem, comm)
    if chunk is not None:
        four.update(ssm_chunk_scan_s=[chunk] * 3, ssm_wall_s=[0.87] * 3)
    if paired:
        four.update(ssm_whole_s=[1.0] * 3)
        two.update(ssm_whole_s=[1.0] * 3)
    one = {**_e17_side(1, one_ssm, 1.0, 1.0, 1.0), "ssm_wall_s": [1.0] * 3}
    return {"one": one, "two": two, "four": four}


def _e17(*rounds, devices=2):
    return {"setup": {"T": 2048}, "device": "cpu", "devices": devices, "load_avg": [1.0, 1.0, 1.0],
            "rounds": list(rounds) if devices >= 2 else []}


def test_e17():
    ok = _e17_round()
    d = check("e17_split_devices", _e17(ok, ok, ok), SUPPORTED)
    assert d.repeats == [SUPPORTED] * 3 and d.regime
    check("e17_split_devices", _e17(*[_e17_round(attn=0.97)] * 3), NOT_SUPPORTED)  # attention did not split
    check("e17_split_devices", _e17(*[_e17_round(ssm4=0.98)] * 3), NOT_SUPPORTED)  # the linear recurrence did not
    # the LSTM relay cannot split by construction: its ratio is shown, never deciding
    check("e17_split_devices", _e17(*[_e17_round(lstm=0.55)] * 3), SUPPORTED)
    check("e17_split_devices", _e17(*[_e17_round(mem=0.95)] * 3), NOT_SUPPORTED)  # memory did not fall
    check("e17_split_devices", _e17(*[_e17_round(ssm4=0.75)] * 3), INCONCLUSIVE)  # its range straddles 0.75
    check("e17_split_devices", _e17(*[_e17_round(mem=0.0)] * 3), INCONCLUSIVE)  # a 0-byte peak: a fault
    d = check("e17_split_devices", _e17(ok, devices=1), INCONCLUSIVE)  # one device: nothing to split across
    assert d.qualifier == REGIME_NOT_REACHED
    d = check("e17_split_devices", _e17(*[_e17_round(comm=0.4)] * 3), INCONCLUSIVE)  # communication dominates
    assert d.qualifier == REGIME_NOT_REACHED
    d = check("e17_split_devices", _e17(ok, _e17_round(attn=0.97), ok), INCONCLUSIVE)  # the rounds disagree
    assert d.qualifier == UNSTABLE
    # the LSTM relay's ratio, whatever it is, is shown (paired with the whole sequence in its own launch)
    d = check("e17_split_devices", _e17(*[_e17_round(lstm=0.82)] * 3), SUPPORTED)
    assert "LSTM relay (shown) 0.82x at 2" in d.figure
    # 4 processes on 2 cores: per-process CPU time stands for a core each only while a rank's quarter costs its share
    d = check("e17_split_devices", _e17(*[_e17_round(chunk=0.28)] * 3), SUPPORTED)
    assert any("wall time, 4 processes on 2 cores" in r for r in d.reasons)
    for chunk in (0.1, 0.5):  # work hidden, or inflated by sharing the cores
        d = check("e17_split_devices", _e17(*[_e17_round(chunk=chunk)] * 3), INCONCLUSIVE)
        assert d.qualifier == REGIME_NOT_REACHED
    # a slow 1-process launch (1.6x the pace of the 4-process one): across launches the stand-in reads 0.70 and the
    # split 0.34x; paired with the whole scan in the same launch, neither moves
    d = check("e17_split_devices", _e17(*[_e17_round(chunk=0.28, one_ssm=1.6)] * 3), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED
    d = check("e17_split_devices", _e17(*[_e17_round(chunk=0.28, one_ssm=1.6, paired=True)] * 3), SUPPORTED)
    assert "SSM 0.55x" in d.figure and any("same launch" in c["name"] and c["shown"] == "1.12x" for c in d.regime)
    # each call is paired with its own whole scan: a launch whose pace moved between calls (1.0, 1.6, 1.0) reads the
    # same split in every pair, where a range over the calls would straddle the threshold
    drift = _e17_round(chunk=0.28, paired=True)
    drift["four"].update(ssm_s=[0.55, 0.88, 0.55], ssm_whole_s=[1.0, 1.6, 1.0], ssm_chunk_scan_s=[0.28, 0.45, 0.28])
    d = check("e17_split_devices", _e17(*[drift] * 3), SUPPORTED)
    assert "4 / 1: 0.55 (range 0.55-0.55)" in d.reasons[0]
    # paired, the split that did not gain still refutes, however slow the 1-process launch was
    check("e17_split_devices", _e17(*[_e17_round(chunk=0.28, ssm4=0.98, one_ssm=1.6, paired=True)] * 3), NOT_SUPPORTED)
    check("e17_split_devices", _e17(*[_e17_round(chunk=0.1)] * 3, devices=4), SUPPORTED)  # a core each: no stand-in


# --- claim 18: self-attention for sequential recommendation ---------------------------------------------------------
def _e18_seed(seed, vs_markov=0.03, vs_gru=0.02, se=0.005, short=0.0, long_=0.03, bucket_se=0.005, users=(100, 100),
              over_pop=(4.0, 3.5), plateau=(12, 9)):
    """One seed's paired comparisons in e18's shape: sasrec minus each baseline, its lead in two buckets, and the
    epochs each neural model trained after its best validation epoch (``plateau``)."""
    pair = lambda d, s, n=1000: {"diff": d, "se": s, "users": n}  # noqa: E731
    return {"seed": seed, "vs": {"markov": pair(vs_markov, se), "gru4rec": pair(vs_gru, se)},
            "over_pop": {"sasrec": over_pop[0], "gru4rec": over_pop[1]},
            "plateau": {"sasrec": plateau[0], "gru4rec": plateau[1]},
            "leads": [{"bucket": "10-19", "vs": "gru4rec", **pair(short, bucket_se, users[0])},
                      {"bucket": "100-199", "vs": "gru4rec", **pair(long_, bucket_se, users[1])}]}


def _e18(*seeds):
    model = {"full": {"ndcg@10": [0.1] * len(seeds), "hr@10": [0.2] * len(seeds)}, "buckets": [], "train_s": [1.0]}
    return {"source": "synthetic", "data": {"name": "s"}, "protocol": "p", "seeds": len(seeds), "device": "cpu",
            "models": {n: model for n in ("sasrec", "markov", "gru4rec", "pop")}, "per_seed": list(seeds)}


def test_e18():
    d = check("e18_recsys", _e18(*[_e18_seed(i) for i in range(3)]), SUPPORTED)
    assert d.repeats == [SUPPORTED] * 3 and d.regime
    check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=-0.02) for i in range(3)]), NOT_SUPPORTED)  # gru4rec ahead
    check("e18_recsys", _e18(*[_e18_seed(i, short=0.04, long_=0.0) for i in range(3)]), NOT_SUPPORTED)  # lead shrinks
    # a 0.009 gap with a standard error of 0.008: within 2 standard errors, inconclusive (not "not supported")
    check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=-0.009, se=0.008) for i in range(3)]), INCONCLUSIVE)
    check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=0.002, se=0.0001) for i in range(3)]), INCONCLUSIVE)  # < 0.003
    d = check("e18_recsys", _e18(*[_e18_seed(i, over_pop=(1.2, 3.0)) for i in range(3)]), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # sasrec barely above popularity: it did not learn
    d = check("e18_recsys", _e18(*[_e18_seed(i, users=(5, 100)) for i in range(3)]), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # one bucket of 30 users: the trend is untested
    d = check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=-0.02, plateau=(1, 9)) for i in range(3)]), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # sasrec cut off by the time cap while still improving
    old = _e18(*[_e18_seed(i) for i in range(3)])
    for s in old["per_seed"]:
        s.pop("plateau")  # a run before the change: its convergence unknown
    assert check("e18_recsys", old, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    d = check("e18_recsys", _e18(_e18_seed(0), _e18_seed(1, vs_gru=-0.02), _e18_seed(2)), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE

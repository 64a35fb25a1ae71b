"""Every verdict can fail: each experiment's decide() is fed hand-made measurements that must give "supported",
"not supported" and "inconclusive". Pure Python: no model runs, no clock."""
import copy
import importlib
import re
from pathlib import Path

import pytest

from attnlab.experiments.base import (INCONCLUSIVE, NOT_SUPPORTED, REGIME_NOT_REACHED, SUPPORTED, UNSTABLE, Decision,
                                      condition, in_regime, over_repeats)


def _decide(name):
    mod = importlib.import_module(f"attnlab.experiments.{name}")
    if not hasattr(mod, "decide"):
        pytest.skip(f"{name} has no decide() yet")
    return mod.decide


def _check(name, measured, expected):
    d = _decide(name)(copy.deepcopy(measured))
    assert d.verdict == expected, (d.verdict, d.reasons)
    assert d.figure and d.reasons and all(isinstance(r, str) and r for r in d.reasons)
    return d


def _with(base, fn):
    m = copy.deepcopy(base)
    fn(m)
    return m


def test_in_regime_turns_any_verdict_outside_the_regime_into_inconclusive():
    met, missed = condition("lengths", 4.0, ">= 4x trained", True), condition("learned", 0.3, ">= 0.9", False)
    for v in (SUPPORTED, NOT_SUPPORTED):
        inside = in_regime([met], Decision(v, "fig", ["r"]))
        assert (inside.verdict, inside.qualifier, inside.regime) == (v, "", [met])
        outside = in_regime([met, missed], Decision(v, "fig", ["r"]))
        assert (outside.verdict, outside.qualifier) == (INCONCLUSIVE, REGIME_NOT_REACHED)
        assert outside.label == "inconclusive (regime not reached)" and repr(v) in outside.reasons[-1]
    assert condition("x", float("nan"), "> 0", True)["met"] is None  # a NaN measurement meets nothing
    assert in_regime([condition("x", float("nan"), "> 0", True)], Decision(SUPPORTED, "f")).verdict == INCONCLUSIVE


def test_over_repeats_needs_agreement():
    s, n = Decision(SUPPORTED, "f", ["a"]), Decision(NOT_SUPPORTED, "f", ["b"])
    assert over_repeats([s, s, s]).verdict == SUPPORTED
    assert over_repeats([n, n, n]).verdict == NOT_SUPPORTED
    mixed = over_repeats([s, n, s])
    assert (mixed.verdict, mixed.qualifier, mixed.repeats) == (INCONCLUSIVE, UNSTABLE, [SUPPORTED, NOT_SUPPORTED, SUPPORTED])
    out = in_regime([condition("learned", 0.1, ">= 0.9", False)], s)
    assert over_repeats([s, out, s]).qualifier == REGIME_NOT_REACHED
    with pytest.raises(ValueError):
        over_repeats([])


# --- claim 1: traced depth ---------------------------------------------------------------------------------------
E01 = {"exponents": {"transformer": {"depth": 0.0, "work": 1.5, "attention_work": 2.0}, "rnn": {"depth": 1.0},
                     "lstm": {"depth": 0.99}, "gru": {"depth": 1.0}, "ssm-parallel": {"depth": 0.1}}}


def test_e01():
    d = _check("e01_work_depth", E01, SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    _check("e01_work_depth", _with(E01, lambda m: m["exponents"]["transformer"].update(depth=0.5)), NOT_SUPPORTED)
    _check("e01_work_depth", _with(E01, lambda m: m["exponents"]["lstm"].update(depth=0.6)), NOT_SUPPORTED)
    _check("e01_work_depth", _with(E01, lambda m: m["exponents"]["gru"].update(depth=None)), INCONCLUSIVE)
    # the FLOP exponent is the model: a wrong one does not change the verdict
    _check("e01_work_depth", _with(E01, lambda m: m["exponents"]["transformer"].update(attention_work=1.0)), SUPPORTED)


# --- claim 2: utilisation with a spread ---------------------------------------------------------------------------
def _e02(t_range, lstm_range):
    rows = []
    for T in (64, 128):
        for name, (lo, hi) in (("transformer", t_range), ("lstm (loop)", lstm_range), ("lstm (fused)", (0.2, 0.3))):
            rows.append({"model": name, "n": T, "share_of_peak": (lo + hi) / 2, "share_low": lo, "share_high": hi})
    return {"lengths": [64, 128], "rows": rows}


def test_e02():
    _check("e02_parallel_idle", _e02((0.15, 0.17), (0.02, 0.03)), SUPPORTED)
    _check("e02_parallel_idle", _e02((0.02, 0.03), (0.15, 0.17)), NOT_SUPPORTED)
    _check("e02_parallel_idle", _e02((0.10, 0.20), (0.15, 0.17)), INCONCLUSIVE)


# --- claim 3: gradients and recall (owned elsewhere; tested once it has decide) ------------------------------------
# --- claim 4: permutation equivariance ----------------------------------------------------------------------------
E04 = {"max_deviation": {"none": 1e-6, "sinusoidal": 5.0, "learned": 3.0, "rope": 10.0, "alibi": 1.0}}


def test_e04():
    _check("e04_permutation", E04, SUPPORTED)
    _check("e04_permutation", _with(E04, lambda m: m["max_deviation"].update(none=1e-2)), NOT_SUPPORTED)
    _check("e04_permutation", _with(E04, lambda m: m["max_deviation"].update(rope=1e-5)), NOT_SUPPORTED)
    _check("e04_permutation", _with(E04, lambda m: m["max_deviation"].update(learned=float("nan"))), INCONCLUSIVE)


# --- claim 5: extrapolation over seeds ----------------------------------------------------------------------------
def _e05(rope, sin):
    return {"ratio_4L_by_seed": {"rope": rope, "sinusoidal": sin}, "ratio_4L": {"alibi": 0.96, "rope+ntk": 1.6}}


def test_e05():
    _check("e05_extrapolation", _e05([3.0, 3.1, 2.9], [4.0, 4.2, 3.9]), SUPPORTED)
    _check("e05_extrapolation", _e05([4.0, 4.2, 3.9], [3.0, 3.1, 2.9]), NOT_SUPPORTED)
    _check("e05_extrapolation", _e05([3.0, 4.5, 3.3], [4.0, 3.2, 3.9]), INCONCLUSIVE)  # gap inside the seed spread
    d = _check("e05_extrapolation", _e05([3.0], [4.0]), SUPPORTED)  # quick scale: one seed, said so
    assert any("one seed" in r for r in d.reasons)


# --- claim 6: naive time and measured memory ------------------------------------------------------------------------
E06 = {"exponents": {"naive": 1.95, "naive_fastest": 1.9, "naive_peak_bytes": 1.98, "sdpa": 1.7, "flash": 1.8},
       "failed": [], "model_8k_to_128k": {"attention": 256.0, "mlp": 16.0}}


def test_e06():
    d = _check("e06_quadratic", E06, SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    _check("e06_quadratic", _with(E06, lambda m: m["exponents"].update(naive=1.3, naive_fastest=1.2)), NOT_SUPPORTED)
    _check("e06_quadratic", _with(E06, lambda m: m["exponents"].update(naive_peak_bytes=1.2)), NOT_SUPPORTED)
    _check("e06_quadratic", _with(E06, lambda m: m["exponents"].update(naive=0.7)), INCONCLUSIVE)  # implausible
    _check("e06_quadratic", _with(E06, lambda m: m["exponents"].update(naive_peak_bytes=0.3)), INCONCLUSIVE)
    _check("e06_quadratic", _with(E06, lambda m: m["exponents"].update(naive_fastest=1.5)), INCONCLUSIVE)  # fits disagree
    _check("e06_quadratic", _with(E06, lambda m: m.update(failed=["failed: killed"])), INCONCLUSIVE)
    # the cost model's factor is not in the verdict
    _check("e06_quadratic", _with(E06, lambda m: m["model_8k_to_128k"].update(attention=3.0)), SUPPORTED)


# --- claim 7: MLP vs attention core -------------------------------------------------------------------------------
def _e07(mlp, core):
    rows = [{"n": n, "mlp_s": sum(mlp) / 2, "mlp_min_s": mlp[0], "mlp_max_s": mlp[1], "attention_core_s": sum(core) / 2,
             "attention_core_min_s": core[0], "attention_core_max_s": core[1], "core_share_of_layer": 0.2}
            for n in (256, 512, 1024, 2048)]
    return {"rows": rows, "lengths": [256, 512, 1024, 2048], "measured_crossover": None, "analytic_crossover": 6143.0}


def test_e07():
    _check("e07_ffn_share", _e07((2.0, 2.2), (1.0, 1.1)), SUPPORTED)
    _check("e07_ffn_share", _e07((1.0, 1.1), (2.0, 2.2)), NOT_SUPPORTED)
    _check("e07_ffn_share", _e07((1.0, 2.0), (1.5, 1.6)), INCONCLUSIVE)


# --- claim 8: remedies (owned elsewhere) --------------------------------------------------------------------------
# --- claims 9 and 11: a ratio over repeats ------------------------------------------------------------------------
def _e09(ratios):
    return {"ratios_longest": ratios, "rows": [{"prompt_tokens": 512, "prefill_tok_per_s": 5000.0,
                                                "decode_tok_per_s": 200.0}]}


def test_e09():
    _check("e09_prefill_decode", _e09([25.0, 30.0, 28.0]), SUPPORTED)
    _check("e09_prefill_decode", _e09([2.0, 3.0, 4.5]), NOT_SUPPORTED)
    _check("e09_prefill_decode", _e09([4.0, 6.0, 5.5]), INCONCLUSIVE)


def _e11(ratios):
    return {"runs": [{"ratio": r} for r in ratios], "modelled_ratio": {"h100-sxm": 300.0, "rtx-4090": 200.0}}


def test_e11():
    d = _check("e11_input_cheaper", _e11([30.0, 31.0, 29.0]), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    _check("e11_input_cheaper", _e11([1.5, 2.0, 2.5]), NOT_SUPPORTED)
    _check("e11_input_cheaper", _e11([2.5, 3.5, 4.0]), INCONCLUSIVE)
    # the GPU roofline is the model: a tiny modelled ratio does not change the verdict
    _check("e11_input_cheaper", _with(_e11([30.0, 31.0, 29.0]), lambda m: m.update(modelled_ratio={"h200": 1.0})),
           SUPPORTED)


# --- claim 10: speedup and measured decode memory -----------------------------------------------------------------
PER_TOK = 18432


def _e10(first=(1.5, 1.6, 1.7), last=(9.0, 10.0, 11.0), slope=PER_TOK, bump=0):
    ctx = [70, 134, 262, 518]
    peaks = [{"context": c, "peak_bytes": 40_000 + slope * c + (bump if c == 262 else 0), "state_nbytes": PER_TOK * c}
             for c in ctx]
    return {"lengths": [64, 128, 256, 512], "speedups": {"64": list(first), "512": list(last)},
            "formula_bytes_per_token": PER_TOK, "decode_peaks": peaks, "memory_error": None}


def test_e10():
    _check("e10_kv_cache", _e10(), SUPPORTED)
    _check("e10_kv_cache", _e10(last=(1.0, 1.2, 1.3)), NOT_SUPPORTED)  # no growth, below 3x
    _check("e10_kv_cache", _e10(slope=2 * PER_TOK), NOT_SUPPORTED)  # holds twice the formula: a copy of the cache
    _check("e10_kv_cache", _e10(bump=3_000_000), NOT_SUPPORTED)  # not on a line
    _check("e10_kv_cache", _e10(last=(2.5, 3.2, 3.5)), INCONCLUSIVE)  # repeats straddle 3x
    _check("e10_kv_cache", _with(_e10(), lambda m: m.update(decode_peaks=None, memory_error="no /proc")), INCONCLUSIVE)


# --- claim 12: end-to-end chat time -------------------------------------------------------------------------------
def _e12(resend, reuse):
    return {"turns": 8, "total_s_by_repeat": {"resend": resend, "reuse": reuse}, "resent_token_exponent": 1.9,
            "prompt_tokens": {"resend": [48, 160], "reuse": [48, 112]}}


def test_e12():
    d = _check("e12_long_chats", _e12([2.0, 2.1, 2.2], [1.0, 1.05, 1.1]), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    _check("e12_long_chats", _e12([1.2, 1.25, 1.3], [1.1, 1.12, 1.14]), NOT_SUPPORTED)  # faster, but under 1.25x
    _check("e12_long_chats", _e12([1.0, 1.05, 1.1], [2.0, 2.1, 2.2]), NOT_SUPPORTED)  # reuse slower
    _check("e12_long_chats", _e12([2.0, 1.0, 1.6], [1.2, 1.3, 1.4]), INCONCLUSIVE)  # within the spread


# --- claim 13: speculative decoding -------------------------------------------------------------------------------
def _e13(speedups, identical=True):
    return {"rows": [{"k": k, "speedup": s, "acceptance": 0.5, "identical": identical, "speedup_by_prompt": [s, s]}
                     for k, s in zip((1, 2, 4, 6), speedups)]}


def test_e13():
    _check("e13_speculative", _e13([1.1, 1.4, 1.3, 1.0]), SUPPORTED)
    _check("e13_speculative", _e13([0.7, 0.8, 0.6, 0.5]), NOT_SUPPORTED)
    _check("e13_speculative", _e13([1.1, 1.4, 1.3, 1.0], identical=False), NOT_SUPPORTED)
    _check("e13_speculative", _e13([1.05, 1.1, 0.9, 0.8]), INCONCLUSIVE)


# --- claim 17: attention and a linear recurrence split across devices, a nonlinear recurrence does not --------------
def _e17_side(P, ssm, lstm, attn=None, mem=None, comm=0.0):
    """One launch: three calls per part at the given ratio to 1.0, with a little spread (x 0.98, 1.0, 1.02)."""
    calls = lambda r: [r * f for f in (0.98, 1.0, 1.02)]  # noqa: E731
    side = {"processes": P, "ssm_s": calls(ssm), "lstm_s": calls(lstm)}
    if attn is not None:  # attention runs at 1 and 2 processes only
        side.update(attn_s=calls(attn), attn_peak_bytes=[mem * 100e6] * 3, comm_s=comm)
    return side


def _e17_round(attn=0.52, ssm4=0.55, lstm=1.02, mem=0.7, comm=0.01, ssm2=1.0):
    return {"one": _e17_side(1, 1.0, 1.0, 1.0, 1.0), "two": _e17_side(2, ssm2, lstm, attn, mem, comm),
            "four": _e17_side(4, ssm4, lstm)}


def _e17(*rounds, devices=2):
    return {"setup": {"T": 2048}, "device": "cpu", "devices": devices, "load_avg": [1.0, 1.0, 1.0],
            "rounds": list(rounds) if devices >= 2 else []}


def test_e17():
    ok = _e17_round()
    d = _check("e17_split_devices", _e17(ok, ok, ok), SUPPORTED)
    assert d.repeats == [SUPPORTED] * 3 and d.regime
    _check("e17_split_devices", _e17(*[_e17_round(attn=0.97)] * 3), NOT_SUPPORTED)  # attention did not split
    _check("e17_split_devices", _e17(*[_e17_round(ssm4=0.98)] * 3), NOT_SUPPORTED)  # the linear recurrence did not
    _check("e17_split_devices", _e17(*[_e17_round(lstm=0.55)] * 3), NOT_SUPPORTED)  # the nonlinear one split after all
    _check("e17_split_devices", _e17(*[_e17_round(mem=0.95)] * 3), NOT_SUPPORTED)  # memory did not fall
    _check("e17_split_devices", _e17(*[_e17_round(ssm4=0.75)] * 3), INCONCLUSIVE)  # its range straddles 0.75
    _check("e17_split_devices", _e17(*[_e17_round(mem=0.0)] * 3), INCONCLUSIVE)  # a 0-byte peak: a fault
    d = _check("e17_split_devices", _e17(ok, devices=1), INCONCLUSIVE)  # one device: nothing to split across
    assert d.qualifier == REGIME_NOT_REACHED
    d = _check("e17_split_devices", _e17(*[_e17_round(comm=0.4)] * 3), INCONCLUSIVE)  # communication dominates
    assert d.qualifier == REGIME_NOT_REACHED
    d = _check("e17_split_devices", _e17(ok, _e17_round(lstm=0.55), ok), INCONCLUSIVE)  # the rounds disagree
    assert d.qualifier == UNSTABLE


# --- claim 18: self-attention for sequential recommendation ---------------------------------------------------------
def _e18_seed(seed, vs_markov=0.03, vs_gru=0.02, se=0.005, short=0.0, long_=0.03, bucket_se=0.005, users=(100, 100),
              over_pop=(4.0, 3.5)):
    """One seed's paired comparisons in e18's shape: sasrec minus each baseline, and its lead in two buckets."""
    pair = lambda d, s, n=1000: {"diff": d, "se": s, "users": n}  # noqa: E731
    return {"seed": seed, "vs": {"markov": pair(vs_markov, se), "gru4rec": pair(vs_gru, se)},
            "over_pop": {"sasrec": over_pop[0], "gru4rec": over_pop[1]},
            "leads": [{"bucket": "10-19", "vs": "gru4rec", **pair(short, bucket_se, users[0])},
                      {"bucket": "100-199", "vs": "gru4rec", **pair(long_, bucket_se, users[1])}]}


def _e18(*seeds):
    model = {"full": {"ndcg@10": [0.1] * len(seeds), "hr@10": [0.2] * len(seeds)}, "buckets": [], "train_s": [1.0]}
    return {"source": "synthetic", "data": {"name": "s"}, "protocol": "p", "seeds": len(seeds), "device": "cpu",
            "models": {n: model for n in ("sasrec", "markov", "gru4rec", "pop")}, "per_seed": list(seeds)}


def test_e18():
    d = _check("e18_recsys", _e18(*[_e18_seed(i) for i in range(3)]), SUPPORTED)
    assert d.repeats == [SUPPORTED] * 3 and d.regime
    _check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=-0.02) for i in range(3)]), NOT_SUPPORTED)  # gru4rec ahead
    _check("e18_recsys", _e18(*[_e18_seed(i, short=0.04, long_=0.0) for i in range(3)]), NOT_SUPPORTED)  # lead shrinks
    # a 0.009 gap with a standard error of 0.008: within 2 standard errors, inconclusive (not "not supported")
    _check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=-0.009, se=0.008) for i in range(3)]), INCONCLUSIVE)
    _check("e18_recsys", _e18(*[_e18_seed(i, vs_gru=0.002, se=0.0001) for i in range(3)]), INCONCLUSIVE)  # < 0.003
    d = _check("e18_recsys", _e18(*[_e18_seed(i, over_pop=(1.2, 3.0)) for i in range(3)]), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # sasrec barely above popularity: it did not learn
    d = _check("e18_recsys", _e18(*[_e18_seed(i, users=(5, 100)) for i in range(3)]), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # one bucket of 30 users: the trend is untested
    d = _check("e18_recsys", _e18(_e18_seed(0), _e18_seed(1, vs_gru=-0.02), _e18_seed(2)), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE


def test_every_experiment_is_covered():
    """A new claim file needs its own test here."""
    from attnlab.experiments import registry

    tested = {int(n[len("test_e"):]) for n in globals() if n.startswith("test_e") and n[len("test_e"):].isdigit()}
    # The recall claims (3, 8, 14-16) share fixtures and are tested in test_recall.py as test_claim_N_verdicts.
    for other in ("test_recall.py", "test_recsys.py"):  # claim 18's verdicts are tested with the recsys tests
        text = (Path(__file__).parent / other).read_text()
        tested |= {int(n) for n in re.findall(r"def test_claim_(\d+)_verdicts", text)}
    assert set(registry()) <= tested

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


# --- claim 8: remedies, one window for both halves, per repetition (a timing round and a recall seed) ----------
E08_EXPS = {"sdpa": 2.0, "flash": 1.9, "sliding": 1.0, "block_sparse": 1.5, "linear": 1.0, "ssm": 1.0}


def _e08(tr=(1.0, 0.99, 1.0), rem=(0.1, 0.12, 0.11), exps=(E08_EXPS,) * 3, small=None, lens=(1024, 2048, 4096)):
    def rec(top):
        return {"params": 100_000, "test": {"4": [{"acc": a} for a in (small or top)], "16": [{"acc": a} for a in top]}}

    rounds = [{k: [1e-3 * (T / 1024) ** e for T in lens] for k, e in x.items()} for x in exps]
    return {"lengths": list(lens), "window": 8, "times_s": rounds[0], "times_s_by_round": rounds,
            "recall": {"transformer": rec(tr), **{f: rec(rem) for f in ("sliding", "block_sparse", "linear", "ssm")}}}


def test_e08():
    d = _check("e08_remedies", _e08(), SUPPORTED)
    assert len(d.repeats) == 3 and d.regime and all(c["met"] for c in d.regime)
    _check("e08_remedies", _e08(rem=(1.0, 0.99, 1.0)), NOT_SUPPORTED)  # the remedies recall as well
    _check("e08_remedies", _e08(exps=({**E08_EXPS, "sliding": 2.2},) * 3), NOT_SUPPORTED)  # a remedy grows faster
    _check("e08_remedies", _e08(exps=({**E08_EXPS, "block_sparse": 0.68},) * 3), INCONCLUSIVE)  # implausible fit
    _check("e08_remedies", _e08(rem=(0.97, 0.96, 0.97)), INCONCLUSIVE)  # exact ahead by less than the margin
    d = _check("e08_remedies", _e08(exps=(E08_EXPS, {**E08_EXPS, "linear": 2.1}, E08_EXPS)), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    d = _check("e08_remedies", _e08(tr=(0.4, 0.3, 0.35), rem=(0.1, 0.1, 0.1)), INCONCLUSIVE)  # nobody learned recall
    assert d.qualifier == REGIME_NOT_REACHED
    d = _check("e08_remedies", _e08(lens=(64, 128, 256)), INCONCLUSIVE)  # n too short for the window's exponent
    assert d.qualifier == REGIME_NOT_REACHED


# --- claim 9: prefill vs decode and a flat TPOT, per round, in the memory/overhead-bound regime ------------------
def _e09_round(ratio=20.0, tpot_growth=1.2, batch_cost=1.3, lens=(64, 512)):
    first = {"prompt_tokens": lens[0], "ttft_s": 0.01, "tpot_s": 0.0014, "prefill_tok_per_s": 6000.0,
             "decode_tok_per_s": 700.0}
    tpot = 0.0014 * tpot_growth
    last = {"prompt_tokens": lens[1], "ttft_s": 0.08, "tpot_s": tpot, "prefill_tok_per_s": ratio / tpot,
            "decode_tok_per_s": 1 / tpot}
    return {"rows": [first, last], "batch_step_cost": batch_cost}


def _e09(*rounds):
    return {"rounds": list(rounds), "rows": rounds[0]["rows"]}


def test_e09():
    d = _check("e09_prefill_decode", _e09(*[_e09_round()] * 3), SUPPORTED)
    assert len(d.repeats) == 3 and d.regime and all(c["met"] for c in d.regime)
    _check("e09_prefill_decode", _e09(*[_e09_round(ratio=3.0)] * 3), NOT_SUPPORTED)  # prefill not many times decode
    _check("e09_prefill_decode", _e09(*[_e09_round(tpot_growth=1.8)] * 3), NOT_SUPPORTED)  # TPOT not flat
    d = _check("e09_prefill_decode", _e09(_e09_round(), _e09_round(tpot_growth=1.8), _e09_round()), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    d = _check("e09_prefill_decode", _e09(*[_e09_round(batch_cost=5.0)] * 3), INCONCLUSIVE)  # compute-bound decode
    assert d.qualifier == REGIME_NOT_REACHED
    d = _check("e09_prefill_decode", _e09(*[_e09_round(lens=(64, 256))] * 3), INCONCLUSIVE)  # prompt too short
    assert d.qualifier == REGIME_NOT_REACHED


# --- claim 11: input vs output tokens, batched, per repetition -----------------------------------------------------
def _e11_rep(ratios=(8.0, 5.0), batches=(8, 32), steps=32, prompt=256):
    return [{"batch": b, "prompt_tokens": prompt, "new_tokens": 32, "steps": steps, "input_s_per_token": 1e-4,
             "output_s_per_token": r * 1e-4, "ratio": r} for b, r in zip(batches, ratios)]


def _e11(*reps):
    return {"repeats": list(reps), "batches": [r["batch"] for r in reps[0]],
            "modelled_ratio": {"h100-sxm": 24.0, "rtx-4090": 10.0}}


def test_e11():
    d = _check("e11_input_cheaper", _e11(*[_e11_rep()] * 3), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons) and len(d.repeats) == 3
    _check("e11_input_cheaper", _e11(*[_e11_rep((4.0, 2.0))] * 3), NOT_SUPPORTED)  # fails at batch 32
    d = _check("e11_input_cheaper", _e11(_e11_rep(), _e11_rep((4.0, 2.0)), _e11_rep()), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    d = _check("e11_input_cheaper", _e11(*[_e11_rep(batches=(1, 2))] * 3), INCONCLUSIVE)  # not a provider's batch
    assert d.qualifier == REGIME_NOT_REACHED
    d = _check("e11_input_cheaper", _e11(*[_e11_rep(steps=64)] * 3), INCONCLUSIVE)  # the batch did not decode together
    assert d.qualifier == REGIME_NOT_REACHED
    # the GPU roofline is the model: a tiny modelled ratio does not change the verdict
    _check("e11_input_cheaper", _with(_e11(*[_e11_rep()] * 3), lambda m: m.update(modelled_ratio={"h200": 1.0})),
           SUPPORTED)


# --- claim 10: speedup per repetition, memory counted as the cache grows --------------------------------------------
PER_TOK = 18432


def _e10_rep(first=1.6, last=10.0, lens=(64, 128, 256, 512)):
    return [{"context": T, "cached_tpot_s": 0.001, "uncached_tpot_s": 0.001 * s, "speedup": s}
            for T, s in zip(lens, (first, 3.0, 5.0, last))]


def _e10(*reps, slope=PER_TOK, bump=0, lstm_slope=0, lens=(64, 128, 256, 512)):
    kv = [{"context": c, "bytes": 40_000 + slope * c + (bump if c == 256 else 0)} for T in lens for c in range(T, T + 7)]
    rnn = [{"context": c, "bytes": 12_800 + lstm_slope * c} for T in lens for c in range(T, T + 7)]
    return {"lengths": list(lens), "repeats": [_e10_rep(*r, lens=lens) for r in (reps or [()] * 3)],
            "formula_bytes_per_token": PER_TOK, "kv_growth": kv, "lstm_growth": rnn, "memory_error": None}


def test_e10():
    d = _check("e10_kv_cache", _e10(), SUPPORTED)
    assert len(d.repeats) == 3 and d.regime and all(c["met"] for c in d.regime)
    _check("e10_kv_cache", _e10((1.5, 1.3), (1.5, 1.3), (1.5, 1.3)), NOT_SUPPORTED)  # no growth, below 3x
    _check("e10_kv_cache", _e10(slope=2 * PER_TOK), NOT_SUPPORTED)  # holds twice the formula: a copy of the cache
    _check("e10_kv_cache", _e10(bump=3_000_000), NOT_SUPPORTED)  # not on a line
    _check("e10_kv_cache", _e10(lstm_slope=4096), NOT_SUPPORTED)  # the LSTM's state grows with the context
    d = _check("e10_kv_cache", _e10((1.6, 10.0), (5.0, 6.0), (1.6, 10.0)), INCONCLUSIVE)  # one repetition: no growth
    assert d.qualifier == UNSTABLE
    _check("e10_kv_cache", _with(_e10(), lambda m: m.update(kv_growth=None, memory_error="failed")), INCONCLUSIVE)
    d = _check("e10_kv_cache", _e10(lens=(32, 64, 96, 128)), INCONCLUSIVE)  # contexts too short for the claim
    assert d.qualifier == REGIME_NOT_REACHED


# --- claim 12: end-to-end chat time, per repetition, with the original threshold beside -------------------------
def _e12(resend, reuse, reuse_tokens=979):
    return {"turns": 20, "user_tokens": 48, "last_history_tokens": 1416, "total_s_by_repeat": {"resend": resend, "reuse": reuse},
            "resent_token_exponent": 1.9, "prompt_tokens": {"resend": [48, 14640], "reuse": [48, 979]},
            "prompt_tokens_by_repeat": {"resend": [14640] * len(resend), "reuse": [reuse_tokens] * len(reuse)}}


def test_e12():
    d = _check("e12_long_chats", _e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1]), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    assert len(d.repeats) == 3 and all(c["met"] for c in d.regime)
    assert any("original threshold" in r and "-> supported" in r for r in d.reasons)  # 2.0x and more: both pass
    d = _check("e12_long_chats", _e12([1.82, 1.82, 1.82], [1.0, 1.0, 1.0]), SUPPORTED)  # the 1.82x reference run
    assert any("original threshold" in r and "-> not supported" in r for r in d.reasons)
    _check("e12_long_chats", _e12([1.2, 1.25, 1.3], [1.1, 1.12, 1.14]), NOT_SUPPORTED)  # faster, but under 1.25x
    _check("e12_long_chats", _e12([1.0, 1.05, 1.1], [2.0, 2.1, 2.2]), NOT_SUPPORTED)  # reuse slower
    d = _check("e12_long_chats", _e12([2.0, 1.0, 2.0], [1.0, 1.0, 1.0]), INCONCLUSIVE)  # one repetition disagrees
    assert d.qualifier == UNSTABLE
    d = _check("e12_long_chats", _e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1], reuse_tokens=14640), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # the prefix cache never hit: not the claim's comparison
    d = _check("e12_long_chats", _with(_e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1]), lambda m: m.update(turns=4)), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED


# --- claim 13: speculative decoding -------------------------------------------------------------------------------
def _e13(speedups, identical=True):
    return {"rows": [{"k": k, "speedup": s, "acceptance": 0.5, "identical": identical, "speedup_by_prompt": [s, s]}
                     for k, s in zip((1, 2, 4, 6), speedups)]}


def test_e13():
    _check("e13_speculative", _e13([1.1, 1.4, 1.3, 1.0]), SUPPORTED)
    _check("e13_speculative", _e13([0.7, 0.8, 0.6, 0.5]), NOT_SUPPORTED)
    _check("e13_speculative", _e13([1.1, 1.4, 1.3, 1.0], identical=False), NOT_SUPPORTED)
    _check("e13_speculative", _e13([1.05, 1.1, 0.9, 0.8]), INCONCLUSIVE)


# --- claim 17: attention splits across devices, a recurrence does not ----------------------------------------------
def _e17(attn2, lstm2, mem2=0.55):
    one = {"processes": 1, "attn_s": [1.0, 1.0, 1.0], "lstm_s": [1.0, 1.0, 1.0], "attn_peak_bytes": 100e6,
           "lstm_peak_bytes": 10e6}
    two = {"processes": 2, "attn_s": list(attn2), "lstm_s": list(lstm2), "attn_peak_bytes": mem2 * 100e6,
           "lstm_peak_bytes": 5e6}
    return {"setup": {"T": 2048}, "cores": 2, "load_avg": [1.0, 1.0, 1.0], "rows": [one, two],
            "depth": {"lstm": {32: 263, 64: 519}, "transformer": {32: 30, 64: 30}}}


def test_e17():
    _check("e17_split_devices", _e17([0.5, 0.55, 0.52], [1.0, 1.05, 1.1]), SUPPORTED)
    _check("e17_split_devices", _e17([0.95, 1.0, 0.97], [1.0, 1.05, 1.1]), NOT_SUPPORTED)  # attention did not split
    _check("e17_split_devices", _e17([0.5, 0.55, 0.52], [0.5, 0.52, 0.55]), NOT_SUPPORTED)  # the LSTM did
    _check("e17_split_devices", _e17([0.5, 0.55, 0.52], [1.0, 1.05, 1.1], mem2=0.95), NOT_SUPPORTED)  # memory did not
    _check("e17_split_devices", _e17([0.7, 0.9, 0.8], [1.0, 1.05, 1.1]), INCONCLUSIVE)  # straddles 0.75
    _check("e17_split_devices", _e17([0.5, 0.55, 0.52], [1.0, 1.05, 1.1], mem2=0.0), INCONCLUSIVE)  # a 0-byte peak: fault


def test_every_experiment_is_covered():
    """A new claim file needs its own test here."""
    from attnlab.experiments import registry

    tested = {int(n[len("test_e"):]) for n in globals() if n.startswith("test_e") and n[len("test_e"):].isdigit()}
    # The recall claims (3, 8, 14-16) share fixtures and are tested in test_recall.py as test_claim_N_verdicts.
    for other in ("test_recall.py", "test_recsys.py"):  # claim 18's verdicts are tested with the recsys tests
        text = (Path(__file__).parent / other).read_text()
        tested |= {int(n) for n in re.findall(r"def test_claim_(\d+)_verdicts", text)}
    assert set(registry()) <= tested

"""decide() of claims 9-13 (prefill and decode, the KV cache, long chats, speculation): each fed hand-made
measurements that must give "supported", "not supported" and "inconclusive", a failed regime check among them.
Pure Python: no model runs, no clock."""
import pytest

from attnlab.experiments.base import INCONCLUSIVE, NOT_SUPPORTED, REGIME_NOT_REACHED, SUPPORTED, UNSTABLE
from decide_check import check, changed


# --- claim 9: prefill vs decode and a flat TPOT, per round, in the memory/overhead-bound regime ------------------
def _e09_round(ratio=20.0, tpot_growth=1.2, batch_cost=1.3, lens=(64, 512), shares=(0.03, 0.22), beyond=None,
               width=None, ttft=0.08):
    """Rows at lens (cache share of the weights: shares); ``beyond``: (tokens, share, TPOT growth) of a last row;
    ``width``: one short prompt's prefill tokens/s over a batch's (None: a run before it was measured); ``ttft``: the
    last row's TTFT (0.01 at the first)."""
    first = {"prompt_tokens": lens[0], "ttft_s": 0.01, "tpot_s": 0.0014, "prefill_tok_per_s": 6000.0,
             "decode_tok_per_s": 700.0, "kv_share": shares[0]}
    row = lambda T, share, growth: {"prompt_tokens": T, "ttft_s": ttft, "tpot_s": 0.0014 * growth,
                                    "prefill_tok_per_s": ratio / (0.0014 * growth), "decode_tok_per_s": 1 / (0.0014 * growth),
                                    "kv_share": share}
    return {"rows": [first, row(lens[1], shares[1], tpot_growth)] + ([row(*beyond)] if beyond else []),
            "batch_step_cost": batch_cost, **({} if width is None else {"prefill_width_used": width})}


def _e09(*rounds):
    return {"rounds": list(rounds), "rows": rounds[0]["rows"]}


def test_e09():
    d = check("e09_prefill_decode", _e09(*[_e09_round()] * 3), SUPPORTED)
    assert len(d.repeats) == 3 and d.regime and all(c["met"] for c in d.regime)
    check("e09_prefill_decode", _e09(*[_e09_round(ratio=3.0)] * 3), NOT_SUPPORTED)  # prefill not many times decode
    check("e09_prefill_decode", _e09(*[_e09_round(tpot_growth=1.8)] * 3), NOT_SUPPORTED)  # TPOT not flat
    # "TTFT grows slowly", decided where one short prompt leaves the parallel width idle (measured apart from it)
    check("e09_prefill_decode", _e09(*[_e09_round(width=0.1, ttft=0.02)] * 3), SUPPORTED)  # x0.25 per token
    d = check("e09_prefill_decode", _e09(*[_e09_round(width=0.1)] * 3), NOT_SUPPORTED)  # idle width, yet proportional
    assert "TTFT per prompt token x1.00" in d.reasons[-1]
    d = check("e09_prefill_decode", _e09(*[_e09_round(width=0.9)] * 3), SUPPORTED)  # width full: shown, not decided
    assert "regime not reached" in d.reasons[-1]
    d = check("e09_prefill_decode", _e09(_e09_round(), _e09_round(tpot_growth=1.8), _e09_round()), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    d = check("e09_prefill_decode", _e09(*[_e09_round(batch_cost=5.0)] * 3), INCONCLUSIVE)  # compute-bound decode
    assert d.qualifier == REGIME_NOT_REACHED
    d = check("e09_prefill_decode", _e09(*[_e09_round(lens=(64, 256))] * 3), INCONCLUSIVE)  # prompt too short
    assert d.qualifier == REGIME_NOT_REACHED
    # past the weights-bound range TPOT may grow (the cache's reads): flatness is decided up to 512 here
    check("e09_prefill_decode", _e09(*[_e09_round(beyond=(1536, 0.66, 1.6))] * 3), SUPPORTED)
    check("e09_prefill_decode", _e09(*[_e09_round(tpot_growth=1.7, beyond=(1536, 0.66, 1.6))] * 3), NOT_SUPPORTED)
    # the cache rivals the weights already at 512 tokens: the flat range spans 1x, so no verdict on flatness
    d = check("e09_prefill_decode", _e09(*[_e09_round(shares=(0.03, 0.5))] * 3), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED


# --- claim 11: input vs output tokens, batched, per repetition -----------------------------------------------------
def _e11_rep(ratios=(8.0, 5.0), batches=(8, 32), steps=32, prompt=256):
    return [{"batch": b, "prompt_tokens": prompt, "new_tokens": 32, "steps": steps, "input_s_per_token": 1e-4,
             "output_s_per_token": r * 1e-4, "ratio": r} for b, r in zip(batches, ratios)]


def _e11(*reps):
    return {"repeats": list(reps), "batches": [r["batch"] for r in reps[0]],
            "modelled_ratio": {"h100-sxm": 24.0, "rtx-4090": 10.0}}


def test_e11():
    d = check("e11_input_cheaper", _e11(*[_e11_rep()] * 3), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons) and len(d.repeats) == 3
    check("e11_input_cheaper", _e11(*[_e11_rep((4.0, 2.0))] * 3), NOT_SUPPORTED)  # fails at batch 32
    d = check("e11_input_cheaper", _e11(_e11_rep(), _e11_rep((4.0, 2.0)), _e11_rep()), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    d = check("e11_input_cheaper", _e11(*[_e11_rep(batches=(1, 2))] * 3), INCONCLUSIVE)  # not a provider's batch
    assert d.qualifier == REGIME_NOT_REACHED
    d = check("e11_input_cheaper", _e11(*[_e11_rep(steps=64)] * 3), INCONCLUSIVE)  # the batch did not decode together
    assert d.qualifier == REGIME_NOT_REACHED
    # the GPU roofline is the model: a tiny modelled ratio does not change the verdict
    check("e11_input_cheaper", changed(_e11(*[_e11_rep()] * 3), lambda m: m.update(modelled_ratio={"h200": 1.0})),
           SUPPORTED)


# --- claim 10: speedup per repetition, resident memory as the cache grows, per repetition -------------------------
PER_TOK = 18432


def _e10_rep(first=1.6, last=10.0, lens=(64, 128, 256, 512)):
    return [{"context": T, "cached_tpot_s": 0.001, "uncached_tpot_s": 0.001 * s, "speedup": s}
            for T, s in zip(lens, (first, 3.0, 5.0, last))]


def _e10_growth(slope=PER_TOK, bump=0, lstm_slope=0, lens=(64, 128, 256, 512), unwritten=4096):
    """One repetition's resident growth: the cache's and the LSTM's, after each prefill and 6 decoded tokens."""
    pool = 4 * PER_TOK * max(lens)
    kv = [{"context": c, "bytes": 40_000 + slope * c + (bump if c == 256 else 0), "unwritten_bytes": unwritten,
           "state_bytes": pool} for T in lens for c in range(T, T + 7)]
    rnn = [{"context": c, "bytes": 12_800 + lstm_slope * c} for T in lens for c in range(T, T + 7)]
    return {"kv": kv, "lstm": rnn, "memory": "resident"}


def _e10(*reps, lens=(64, 128, 256, 512), growths=None, **memory):
    growths = growths or [_e10_growth(lens=lens, **memory)] * 3
    return {"lengths": list(lens), "repeats": [_e10_rep(*r, lens=lens) for r in (reps or [()] * 3)],
            "formula_bytes_per_token": PER_TOK, "kv_growth": growths[0]["kv"], "lstm_growth": growths[0]["lstm"],
            "growth_by_repeat": growths, "memory": "resident", "memory_error": None}


def test_e10():
    d = check("e10_kv_cache", _e10(), SUPPORTED)
    assert len(d.repeats) == 3 and d.regime and all(c["met"] for c in d.regime)
    check("e10_kv_cache", _e10((1.5, 1.3), (1.5, 1.3), (1.5, 1.3)), NOT_SUPPORTED)  # no growth, below 3x
    check("e10_kv_cache", _e10(slope=2 * PER_TOK), NOT_SUPPORTED)  # holds twice the formula: a copy of the cache
    check("e10_kv_cache", _e10(bump=3_000_000), NOT_SUPPORTED)  # not on a line
    check("e10_kv_cache", _e10(lstm_slope=4096), NOT_SUPPORTED)  # the LSTM's state grows with the context
    d = check("e10_kv_cache", _e10((1.6, 10.0), (5.0, 6.0), (1.6, 10.0)), INCONCLUSIVE)  # one repetition: no growth
    assert d.qualifier == UNSTABLE
    check("e10_kv_cache", changed(_e10(), lambda m: m.update(kv_growth=None, memory_error="failed")), INCONCLUSIVE)
    d = check("e10_kv_cache", _e10(lens=(32, 64, 96, 128)), INCONCLUSIVE)  # contexts too short for the claim
    assert d.qualifier == REGIME_NOT_REACHED
    # each repetition's memory is its own: one that held a copy of the cache disagrees with the others
    d = check("e10_kv_cache", _e10(growths=[_e10_growth(), _e10_growth(slope=2 * PER_TOK), _e10_growth()]),
               INCONCLUSIVE)
    assert d.qualifier == UNSTABLE
    # the allocator's count (the formula by construction), or a pool made whole before any write: no measurement
    counted = changed(_e10(), lambda m: m.update(memory="counted"))
    assert check("e10_kv_cache", counted, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    eager = _e10(unwritten=4 * PER_TOK * 512)
    assert check("e10_kv_cache", eager, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    old = changed(_e10(), lambda m: [m.pop(k) for k in ("growth_by_repeat", "memory")])  # a run before the change
    assert check("e10_kv_cache", old, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    # the prediction's own clauses, as growth exponents of the step times over the contexts (speedups grow in each)
    def powers(uncached, cached):
        return lambda m: m.update(repeats=[[{"context": T, "cached_tpot_s": 1e-3 * (T / 64) ** cached,
                                             "uncached_tpot_s": 4e-3 * (T / 64) ** uncached,
                                             "speedup": 4 * (T / 64) ** (uncached - cached)} for T in m["lengths"]]] * 3)
    d = check("e10_kv_cache", changed(_e10(), powers(1.0, 0.1)), SUPPORTED)
    assert "uncached 1.00 (in proportion, 0.6-1.4? yes), cached 0.10" in d.reasons[-1]
    check("e10_kv_cache", changed(_e10(), powers(1.9, 0.1)), NOT_SUPPORTED)  # quadratic, not in proportion
    check("e10_kv_cache", changed(_e10(), powers(1.51, 0.1)), NOT_SUPPORTED)  # past midway to quadratic
    check("e10_kv_cache", changed(_e10(), powers(1.45, 0.1)), INCONCLUSIVE)  # between the bands
    check("e10_kv_cache", changed(_e10(), powers(0.61, 0.1)), SUPPORTED)  # inside the near band's lower edge
    check("e10_kv_cache", changed(_e10(), powers(0.55, 0.05)), INCONCLUSIVE)  # between the bands
    check("e10_kv_cache", changed(_e10(), powers(0.49, 0.0)), NOT_SUPPORTED)  # past midway to flat
    check("e10_kv_cache", changed(_e10(), powers(1.2, 0.51)), NOT_SUPPORTED)  # the cached step grows, past midway
    check("e10_kv_cache", changed(_e10(), powers(1.2, 0.45)), INCONCLUSIVE)  # cached: between the bands
    check("e10_kv_cache", changed(_e10(), powers(0.9, -0.6)), INCONCLUSIVE)  # faster with context: a cold call


# --- claim 12: end-to-end chat time, per repetition, with the original threshold beside -------------------------
def _e12(resend, reuse, reuse_tokens=979, half=0.75):
    """Each repetition's cumulative times by turn: its gain at turn 10 is ``half`` of its gain at turn 20."""
    by_turn = {"resend": [[1.0] * 9 + [1.0 + (a / b - 1.0) * half] + [1.0] * 9 + [a / b] for a, b in zip(resend, reuse)],
               "reuse": [[1.0] * 20 for _ in reuse]}
    return {"turns": 20, "user_tokens": 48, "last_history_tokens": 1416, "total_s_by_repeat": {"resend": resend, "reuse": reuse},
            "resent_token_exponent": 1.9, "prompt_tokens": {"resend": [48, 14640], "reuse": [48, 979]},
            "prompt_tokens_by_repeat": {"resend": [14640] * len(resend), "reuse": [reuse_tokens] * len(reuse)},
            "cumulative_s_by_repeat": by_turn}


def test_e12():
    d = check("e12_long_chats", _e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1]), SUPPORTED)
    assert any(r.startswith("model (not in the verdict)") for r in d.reasons)
    assert len(d.repeats) == 3 and all(c["met"] for c in d.regime)
    assert any("original threshold" in r and "-> supported" in r for r in d.reasons)  # 2.0x and more: both pass
    d = check("e12_long_chats", _e12([1.82, 1.82, 1.82], [1.0, 1.0, 1.0]), SUPPORTED)  # the 1.82x reference run
    assert any("original threshold" in r and "-> not supported" in r for r in d.reasons)
    check("e12_long_chats", _e12([1.2, 1.25, 1.3], [1.1, 1.12, 1.14]), NOT_SUPPORTED)  # faster, but under 1.25x
    check("e12_long_chats", _e12([1.0, 1.05, 1.1], [2.0, 2.1, 2.2]), NOT_SUPPORTED)  # reuse slower
    d = check("e12_long_chats", _e12([2.0, 1.0, 2.0], [1.0, 1.0, 1.0]), INCONCLUSIVE)  # one repetition disagrees
    assert d.qualifier == UNSTABLE
    d = check("e12_long_chats", _e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1], reuse_tokens=14640), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED  # the prefix cache never hit: not the claim's comparison
    d = check("e12_long_chats", changed(_e12([2.2, 2.1, 2.2], [1.0, 1.05, 1.1]), lambda m: m.update(turns=4)), INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED

    def by_turn(half_gain):  # each repetition's cumulative times, its gain at turn 10 given, at turn 20 2.2x
        return {"resend": [[1.0] * 9 + [half_gain] + [1.0] * 9 + [2.2]] * 3, "reuse": [[1.0] * 20] * 3}
    grows = changed(_e12([2.2] * 3, [1.0] * 3), lambda m: m.update(cumulative_s_by_repeat=by_turn(1.5)))
    assert any("above the gain at turn 10 (1.50x): yes" in r for r in check("e12_long_chats", grows, SUPPORTED).reasons)
    flat = changed(_e12([2.2] * 3, [1.0] * 3), lambda m: m.update(cumulative_s_by_repeat=by_turn(2.4)))
    check("e12_long_chats", flat, NOT_SUPPORTED)  # the margin shrank from the middle turn to the last
    unknown = changed(_e12([2.2] * 3, [1.0] * 3), lambda m: m.pop("cumulative_s_by_repeat"))  # a run before the change
    check("e12_long_chats", unknown, INCONCLUSIVE)


def test_e09_flat_tpot_is_decided_on_paired_steps():
    """Rounds that carry decode steps timed in alternation decide 'TPOT stays flat' on them, whatever the generations'
    TPOT (timed apart) read; rounds without them (runs before that change) on the TPOT."""
    paired = lambda growth, tpot: {**_e09_round(tpot_growth=tpot), "step_growth": growth,  # noqa: E731
                                   "step_growth_range": [growth - 0.1, growth + 0.2], "paired_step_s": [0.011, 0.011 * growth]}
    d = check("e09_prefill_decode", _e09(*[paired(1.27, 1.66)] * 3), SUPPORTED)
    assert "paired x1.27" in d.reasons[0] and "TPOT x1.66 (shown, not decided)" in d.reasons[0]
    assert "a decode step (paired) x1.27" in d.figure
    check("e09_prefill_decode", _e09(*[paired(1.7, 1.2)] * 3), NOT_SUPPORTED)
    d = check("e09_prefill_decode", _e09(paired(1.27, 1.2), paired(1.7, 1.2), paired(1.27, 1.2)), INCONCLUSIVE)
    assert d.qualifier == UNSTABLE


# --- claim 13: speculative decoding -------------------------------------------------------------------------------
def _e13(speedups, identical=True, step_ms=3.6, verify_ms=4.5, draft_ms=0.3, agreement=0.8, loss=1.4):
    """Regime inside by default: a 100 MB target at 30 GB/s (3.3 ms ideal) stepping in 3.6 ms."""
    return {"weight_bytes": 100e6, "bandwidth_bytes_per_s": [29e9, 30e9], "target_step_s": step_ms / 1e3,
            "verify_step_s": verify_ms / 1e3, "draft_step_s": draft_ms / 1e3, "agreement": agreement,
            "target_val_loss": loss, "chosen": {"draft": "d128x1", "k": 3},
            "tuning": [{"draft": "d128x1", "k": k, "speedup": 1.5, "acceptance": a, "proposed": 400, "identical": True}
                       for k, a in ((2, 0.8), (3, 0.7))],
            "rounds": [{"round": r + 1, "speedup": s, "acceptance": 0.7, "identical": identical, "step_s": step_ms / 1e3}
                       for r, s in enumerate(speedups)],
            "distinct_4grams": {"greedy": 0.8, "text": 0.9}}


def test_e13():
    check("e13_speculative", _e13([1.6, 1.5, 1.7]), SUPPORTED)
    check("e13_speculative", _e13([0.8, 0.9, 0.85]), NOT_SUPPORTED)
    check("e13_speculative", _e13([1.6, 1.5, 1.7], identical=False), NOT_SUPPORTED)
    check("e13_speculative", changed(_e13([1.6, 1.5, 1.7]), lambda m: m["tuning"][0].update(identical=False)),
           NOT_SUPPORTED)  # a k tried on the tuning prompts changed greedy output
    d = check("e13_speculative", _e13([1.1, 1.05, 1.15]), INCONCLUSIVE)
    assert d.qualifier == ""  # between break-even and the threshold: the data, not the set-up
    unstable = check("e13_speculative", _e13([1.6, 0.8, 1.5]), INCONCLUSIVE)
    assert unstable.qualifier == UNSTABLE and len(unstable.repeats) == 3
    # "acceptance falls as k grows" cannot rise with k by its definition: shown, never deciding
    rises = changed(_e13([1.6, 1.5, 1.7]), lambda m: m["tuning"][1].update(acceptance=0.9))
    d = check("e13_speculative", rises, SUPPORTED)
    assert "k=2 80.0% of 400, k=3 90.0% of 400" in d.reasons[-1] and "not decided" in d.reasons[-1]
    # a target whose greedy text loops (a tenth of the real text's distinct 4-grams): outside the regime
    loops = changed(_e13([1.6, 1.5, 1.7]), lambda m: m.update(distinct_4grams={"greedy": 0.09, "text": 0.9}))
    assert check("e13_speculative", loops, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    unread = changed(_e13([1.6, 1.5, 1.7]), lambda m: m.pop("distinct_4grams"))  # a run before the change
    assert check("e13_speculative", unread, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    # timed on sampled text: condition (6) reads the sampled text, however much the greedy text loops
    sampled = changed(_e13([1.6, 1.5, 1.7]), lambda m: m.update(temperature=1.0, distinct_4grams={
        "sampled": 0.8, "greedy": 0.09, "text": 0.9}))
    check("e13_speculative", sampled, SUPPORTED)
    sampled_loops = changed(sampled, lambda m: m["distinct_4grams"].update(sampled=0.3))
    assert check("e13_speculative", sampled_loops, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    # each round's own draw decides its condition (6): one round whose text looped leaves the regime there alone
    per_round = changed(sampled, lambda m: [r.update(distinct_4grams_sampled=v) for r, v in
                                            zip(m["rounds"], (0.85, 0.3, 0.8))])
    d = check("e13_speculative", per_round, INCONCLUSIVE)
    assert d.qualifier == REGIME_NOT_REACHED and [c["met"] for c in d.regime].count(False) == 1
    # and a loop in the once-drawn text no longer stands for rounds that drew varied text
    check("e13_speculative", changed(sampled_loops, lambda m: [r.update(distinct_4grams_sampled=0.8)
                                                               for r in m["rounds"]]), SUPPORTED)


@pytest.mark.parametrize("outside", [dict(step_ms=9.0),  # the step is overhead, not weight traffic (2.7x ideal)
                                     dict(verify_ms=7.0),  # verifying k+1 rows costs ~2 steps
                                     dict(draft_ms=1.0),  # the draft costs 28% of a target step
                                     dict(agreement=0.46),  # the draft rarely agrees
                                     dict(loss=2.9)])  # the target has barely learned: its greedy text loops
def test_e13_outside_its_regime_is_inconclusive(outside):
    for speedups in ([0.8, 0.9, 0.85], [1.6, 1.5, 1.7]):
        d = check("e13_speculative", _e13(speedups, **outside), INCONCLUSIVE)
        assert d.qualifier == REGIME_NOT_REACHED
        assert [c["met"] for c in d.regime].count(False) == 3  # one condition, missed in each of 3 rounds
    # conditions measured before each round (bandwidth, verify and draft ratios) are that round's
    paired = _e13([1.6, 1.5, 1.7])
    for r in paired["rounds"]:
        r.update(bandwidth_bytes_per_s=30e9, verify_vs_step=1.2, draft_vs_step=0.05)
    assert check("e13_speculative", paired, SUPPORTED).regime[1]["value"] == 1.2
    paired["rounds"][2]["verify_vs_step"] = 1.7
    assert check("e13_speculative", paired, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    paired["rounds"][2].update(verify_vs_step=1.2, step_s=5.5e-3)  # 1.65x the 3.3 ms ideal at 30 GB/s ...
    assert check("e13_speculative", paired, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    paired["rounds"][2]["bandwidth_bytes_per_s"] = 20e9  # ... but 1.1x at the 20 GB/s measured before that round
    check("e13_speculative", paired, SUPPORTED)
    # condition (1) paired with reads of the weights' bytes (runs from 2026-12-07): that ratio decides it, not the
    # round's step against the best-of bandwidth
    for r in paired["rounds"]:
        r.update(step_s=9e-3, step_vs_read=1.3, paired_step_s=4.3e-3, read_bytes_per_s=30e9)
    d = check("e13_speculative", paired, SUPPORTED)
    assert d.regime[0]["value"] == 1.3 and "paired" in d.regime[0]["name"]
    paired["rounds"][1]["step_vs_read"] = 1.7
    assert check("e13_speculative", paired, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED
    slow_round = _e13([0.8, 0.9, 0.85])
    slow_round["rounds"][1]["step_s"] = 9e-3  # one round's decode step outside: the verdict is not a finding
    assert check("e13_speculative", slow_round, INCONCLUSIVE).qualifier == REGIME_NOT_REACHED


def test_e13_chooses_k_with_a_margin_inside_the_verify_bound():
    """The reference's tuning table: k=6 verified in 1.498 one-row steps (just inside 1.5) and read 1.51-1.55 before
    the held-out rounds; with the margin the fastest eligible k is 4 (1.296)."""
    from attnlab.experiments.e13_speculative import CHOICE_MARGIN, VERIFY_VS_STEP, eligible_settings

    tuned = [{"k": k, "speedup": s, "identical": True, "verify_vs_step": v}
             for k, s, v in ((2, 1.78, 1.341), (3, 2.40, 1.185), (4, 2.71, 1.296), (6, 2.94, 1.498))]
    assert VERIFY_VS_STEP / CHOICE_MARGIN < 1.498
    assert max(eligible_settings(tuned), key=lambda r: r["speedup"])["k"] == 4
    # none within the margin: every identical k stays eligible, and condition (2) reads not met for the one chosen
    assert [r["k"] for r in eligible_settings([dict(r, verify_vs_step=1.45) for r in tuned])] == [2, 3, 4, 6]

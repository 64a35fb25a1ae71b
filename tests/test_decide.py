"""Every verdict can fail: each experiment's decide() is fed hand-made measurements that must give "supported",
"not supported" and "inconclusive" (tests/test_decide_parallel.py, _inference.py, _habits.py, by claim group).
Here: the rules every decide() shares, and that no claim is left without its test. Pure Python: no model runs."""
import re
from pathlib import Path

import pytest

from attnlab.experiments.base import (INCONCLUSIVE, NOT_SUPPORTED, REGIME_NOT_REACHED, SUPPORTED, UNSTABLE, Decision,
                                      clears, condition, in_regime, over_repeats)
from attnlab.timing import middle_half


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


def test_middle_half_leaves_one_spike_out_of_seven_but_not_two_of_five():
    calm = [1.0, 1.1, 1.0, 1.2, 1.1, 1.0, 1.1]
    assert middle_half(calm) == (1.0, 1.1) and middle_half(calm[:-1] + [9.0]) == (1.0, 1.2)
    assert middle_half([1.0, 9.0, 1.1, 9.5, 1.2]) == (1.1, 9.0)  # two of five are no stray: they show
    assert clears([5.8, 5.4, 5.7, 2.3, 6.0, 5.6, 5.5], 2.0) is True
    assert clears([1.5, 1.2, 1.8, 4.0, 1.6, 1.7, 1.4], 2.0) is False
    assert clears([1.5, 2.5, 1.8, 2.4, 2.6, 1.7, 2.2], 2.0) is None


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


def test_a_repetitions_line_quotes_what_decided_it_not_what_is_only_shown():
    d = Decision(NOT_SUPPORTED, "f", ["gap (a): 1 point", "gap (b): -3 points", "shown, not decided: depth mattered"])
    assert over_repeats([d]).reasons == ["repetition 1 of 1: not supported (gap (b): -3 points)"]
    only = Decision(SUPPORTED, "f", ["shown, not decided: x"])
    assert over_repeats([only]).reasons == ["repetition 1 of 1: supported (shown, not decided: x)"]


def test_every_experiment_is_covered():
    """A new claim file needs its own test in one of the test_decide files."""
    from attnlab.experiments import registry

    here = Path(__file__).parent
    tested = set()
    for path in here.glob("test_decide*.py"):
        tested |= {int(n) for n in re.findall(r"^def test_e(\d+)\(", path.read_text(), re.M)}
    # The recall claims (3, 8) share fixtures and are tested in test_recall.py as test_claim_N_verdicts.
    for other in ("test_recall.py", "test_recsys.py"):  # claim 18's verdicts are tested with the recsys tests
        tested |= {int(n) for n in re.findall(r"def test_claim_(\d+)_verdicts", (here / other).read_text())}
    assert set(registry()) <= tested

"""What every experiment declares and returns.

An experiment states its claim, its prediction and the threshold that would support it *before*
measuring (module constants, so they are fixed in code, not chosen after the fact). Each module has

    measure(scale, device) -> dict      # the measurements only (JSON-able), no verdict
    decide(measured: dict) -> Decision  # pure: no torch, no clock; tests feed it made-up measurements
    run(scale, device) -> Outcome       # measure, decide, and lay out plots and tables

so a test can show that every verdict can come out "not supported" or "inconclusive". A claim the data
refutes is reported as "not supported"; too little signal is "inconclusive". A module's ``CHANGES``
list records every change to its prediction, threshold or method after the first measurement (date,
old, new, why); the report shows it under the claim.

Measure where the claim lives: a module's ``REGIME`` states, before measuring, the conditions under which
its claim applies (a memory-bound decode, test lengths beyond training, a model that learned the task).
``decide`` measures each as a ``condition`` and passes them to ``in_regime``: an unmet condition makes the
verdict "inconclusive (regime not reached)", never "not supported", and the page shows each condition
with its measured value beside the verdict. A verdict that comes from several independent repetitions
(seeds or rounds) goes through ``over_repeats``: repetitions that disagree make it "inconclusive (unstable)".
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

from attnlab.timing import middle_half

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
REGIME_NOT_REACHED, UNSTABLE = "regime not reached", "unstable"  # why a verdict is inconclusive, when not the data
SHOWN = "shown, not decided"  # opens a reason that is measured and displayed but takes no part in the verdict
SCALES = ("quick", "full")
FULL_REPEATS = 3  # independent repetitions (seeds or rounds) behind every verdict at full scale


@dataclass
class Series:
    name: str
    x: list
    y: list


@dataclass
class Plot:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    log_x: bool = False
    log_y: bool = False


@dataclass
class Outcome:
    verdict: str
    figure: str  # the key measured figure, in words
    data: dict
    plots: list[Plot] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    device: str | None = None  # where it ran, when not the device it was given (e01 traces on "meta")
    reasons: list[str] = field(default_factory=list)  # each check decide() made, with its numbers
    qualifier: str = ""  # REGIME_NOT_REACHED or UNSTABLE when the verdict is inconclusive for that reason
    regime: list[dict] = field(default_factory=list)  # the conditions the claim needs, each measured (condition())
    repeats: list[str] = field(default_factory=list)  # the verdict of each independent repetition, when several

    @classmethod
    def of(cls, decision: "Decision", data: dict, plots=(), table=(), caveats=(), device=None) -> "Outcome":
        return cls(decision.verdict, decision.figure, data, list(plots), list(table), list(caveats), device,
                   list(decision.reasons), decision.qualifier, list(decision.regime), list(decision.repeats))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Experiment:
    id: int
    slug: str
    title: str
    claim: str
    prediction: str
    threshold: str
    run: Callable  # run(scale: str, device: str) -> Outcome
    decide: Callable | None = None  # decide(measured: dict) -> Decision
    changes: list = field(default_factory=list)  # the module's CHANGES: [{date, what, old, new, why}]
    source: str = ""
    regime: str = ""  # the module's REGIME: where the claim applies, stated before measuring
    est_s: dict = field(default_factory=dict)  # the module's EST_S: {"quick": s, "full": s}, for the progress bar
    training: Callable | None = None  # training(scale, device) -> {key: task}: its models, for the training stage
    train_est_s: dict = field(default_factory=dict)  # the module's TRAIN_EST_S: its share of the stage, in seconds


@dataclass
class Decision:
    verdict: str
    figure: str  # the key measured figure, in words
    reasons: list[str] = field(default_factory=list)  # each check, with its numbers, in the order made
    qualifier: str = ""  # REGIME_NOT_REACHED or UNSTABLE: why an inconclusive verdict is inconclusive
    regime: list[dict] = field(default_factory=list)  # condition() dicts: what the claim needs, measured
    repeats: list[str] = field(default_factory=list)  # one label per independent repetition

    @property
    def label(self) -> str:
        """The verdict as a reader sees it: "inconclusive (regime not reached)" rather than a bare "inconclusive"."""
        return f"{self.verdict} ({self.qualifier})" if self.qualifier else self.verdict


def label(verdict_: str, qualifier: str = "") -> str:
    return f"{verdict_} ({qualifier})" if qualifier else verdict_


def condition(name: str, value, need: str, met: bool | None, shown: str | None = None) -> dict:
    """One measured condition of a claim's regime: ``need`` is the requirement in words (stated before measuring),
    ``value`` the measurement, ``met`` whether it holds (None: could not be measured, which counts as not met)."""
    if isinstance(value, float) and not math.isfinite(value):
        met = None
    return {"name": name, "value": value, "need": need, "met": bool(met) if met is not None else None,
            "shown": shown if shown is not None else (f"{value:.4g}" if isinstance(value, float) else str(value))}


def in_regime(conditions: list[dict], decision: Decision) -> Decision:
    """``decision`` when every condition of the regime holds; otherwise "inconclusive (regime not reached)", keeping
    the figure and the reasons, and saying which verdict the data would have given inside the regime."""
    missed = [c for c in conditions if not c["met"]]
    regime_reasons = [f"regime: {c['name']} {c['shown']} (needs {c['need']}): "
                      f"{'met' if c['met'] else ('not measured' if c['met'] is None else 'not met')}" for c in conditions]
    if not missed:
        return Decision(decision.verdict, decision.figure, regime_reasons + list(decision.reasons), decision.qualifier,
                        list(conditions), list(decision.repeats))
    return Decision(INCONCLUSIVE, decision.figure, regime_reasons + list(decision.reasons) + [
        f"outside the regime ({', '.join(c['name'] for c in missed)}), so no verdict; the data alone would read "
        f"{decision.label!r}"], REGIME_NOT_REACHED, list(conditions), list(decision.repeats))


def _deciding(reasons: list[str]) -> str:
    """The reason a repetition's line quotes: its last one that decides (a "shown, not decided" figure, however late
    in the list, is not why the repetition reads as it does)."""
    return next((r for r in reversed(reasons) if not r.startswith(SHOWN)), reasons[-1])


def over_repeats(decisions: list[Decision], figure: str | None = None) -> Decision:
    """One verdict from independent repetitions, each decided alone: all agree -> that verdict; any outside its
    regime -> "inconclusive (regime not reached)"; otherwise any disagreement -> "inconclusive (unstable)"."""
    if not decisions:
        raise ValueError("over_repeats needs at least one decided repetition")
    labels = [d.label for d in decisions]
    reasons = [f"repetition {i + 1} of {len(decisions)}: {lab}" + (f" ({_deciding(d.reasons)})" if d.reasons else "")
               for i, (d, lab) in enumerate(zip(decisions, labels))]
    many = len(decisions) > 1
    regime = [{**c, "name": f"{c['name']} (repetition {i + 1})" if many else c["name"]}
              for i, d in enumerate(decisions) for c in d.regime]
    first = decisions[0]
    if len(set(labels)) == 1:
        return Decision(first.verdict, figure or first.figure, reasons, first.qualifier, regime, labels)
    if any(d.qualifier == REGIME_NOT_REACHED for d in decisions):
        return Decision(INCONCLUSIVE, figure or first.figure, reasons + [
            "a repetition ran outside the claim's regime, so no verdict"], REGIME_NOT_REACHED, regime, labels)
    return Decision(INCONCLUSIVE, figure or first.figure,
                    reasons + [f"the repetitions disagree ({', '.join(sorted(set(labels)))}), so the verdict is not a finding"],
                    UNSTABLE, regime, labels)


def verdict(supported: bool | None) -> str:
    """True -> supported, False -> not supported, None -> inconclusive."""
    if supported is None:
        return INCONCLUSIVE
    return SUPPORTED if supported else NOT_SUPPORTED


def fit_exponent(xs, ys) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two positive points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def plausible_exponent(e: float | None, lo: float, hi: float) -> bool:
    """A fitted growth exponent a kernel can physically have: an O(T*sqrt(T)) kernel fitting below 1, or any
    kernel below 0.5, is a measuring fault (noise, a cold first call), not a result; the verdict is then inconclusive."""
    return e is not None and lo <= e <= hi


def spread(samples) -> float:
    """max - min over seeds (or repeats): the margin a comparison must beat before it counts."""
    samples = [s for s in samples if s is not None]
    return max(samples) - min(samples) if len(samples) > 1 else 0.0


def mean(samples) -> float:
    samples = [s for s in samples if s is not None]
    return sum(samples) / len(samples)


def compare(a, b) -> bool | None:
    """Is ``a`` larger than ``b`` by more than the seed spread? True: larger beyond the spread; False: smaller
    beyond it; None: the difference is within the spread (inconclusive). ``a``/``b`` are one value per seed."""
    diff = mean(a) - mean(b)
    noise = max(spread(a), spread(b))
    if abs(diff) <= noise:
        return None
    return diff > 0


def clears(samples, threshold: float) -> bool | None:
    """Is the middle half of ``samples`` (repeated timings or their ratios) above ``threshold`` (True), below it
    (False), or astride it (None: inconclusive)?"""
    lo, hi = middle_half(samples)
    return True if lo > threshold else (False if hi < threshold else None)

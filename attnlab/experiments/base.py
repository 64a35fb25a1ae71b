"""What every experiment declares and returns.

An experiment states its claim, its prediction and the threshold that would support it *before*
measuring (module constants, so they are fixed in code, not chosen after the fact), then runs at
``quick`` or ``full`` scale and returns data, plots and a verdict computed from that data by
``decide``. A claim the data refutes is reported as "not supported"; too little signal is
"inconclusive".
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
SCALES = ("quick", "full")


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
    source: str = ""


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


def median_time(fn, repeats: int = 3, warmup: int = 1, *, device) -> float:
    """Median wall time of ``fn()``; on a GPU each call is synchronised, so the time is the work's, not the launch's."""
    import statistics
    import time

    from attnlab.runtime import synchronize

    for _ in range(warmup):
        fn()
    synchronize(device)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        synchronize(device)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)

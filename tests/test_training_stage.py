"""The report's training stage (experiments/training.py): tasks of several phases, run side by side in one pool."""
import math
import operator

import pytest

from attnlab.experiments import training
from attnlab.experiments.training import FILLER, LONG, Job


def _squares_then_sum(n: int, log: list):
    """A task of three phases: n products, then one sum of them, then nothing (an empty batch), then done."""
    squares = yield [Job(operator.mul, (i, i), FILLER) for i in range(n)]
    total, = yield [Job(sum, (squares,), LONG)]
    rest = yield []
    log.append((n, squares, total, rest))


@pytest.mark.parametrize("workers", [1, 2])
def test_every_phase_gets_its_results_in_order(workers):
    log = []
    records = training.run_tasks([_squares_then_sum(n, log) for n in (3, 5)], workers, names=["three", "five"])
    assert sorted(log) == [(3, [0, 1, 4], 5, []), (5, [0, 1, 4, 9, 16], 30, [])]
    # every job recorded once, under its task's name, with what it ran and when: what a slow stage is read from
    assert sorted((r["task"], r["job"]) for r in records) == sorted(
        [("three", f"mul({i}, {i})") for i in range(3)] + [("five", f"mul({i}, {i})") for i in range(5)]
        + [("three", "sum()"), ("five", "sum()")])
    assert all(r["s"] >= 0 and r["start_s"] >= 0 for r in records)
    sums = {r["task"]: r for r in records if r["job"] == "sum()"}
    products = [r for r in records if r["task"] == "five" and r["job"] != "sum()"]
    assert all(sums["five"]["start_s"] >= p["start_s"] for p in products)  # a phase starts after the one before


def test_a_failing_job_fails_the_stage():
    def task():
        yield [Job(math.sqrt, (-1.0,))]

    with pytest.raises(ValueError):
        training.run_tasks([task()], 2)


def test_prepare_runs_a_task_two_claims_share_once():
    log = []
    hook = lambda scale, device: {("shared", scale): _squares_then_sum(2, log)}
    jobs = []
    assert training.prepare([hook, hook], "quick", "cpu", workers=1, jobs=jobs) == 1
    assert log == [(2, [0, 1], 1, [])]
    assert {r["task"] for r in jobs} == {"shared/quick"} and len(jobs) == 3  # two products and their sum


def test_the_report_trains_before_its_first_claim_and_says_how_long():
    """The stage is its own step: the claims' registry carries each module's hook and its share of the estimate."""
    from attnlab.experiments import registry

    exps = registry()
    trains = sorted(i for i, e in exps.items() if e.training)
    assert trains == [3, 5, 8, 13, 14, 15, 16, 18]
    assert all(exps[i].train_est_s.get("full") for i in (3, 5, 8, 13, 14, 18))

"""What every decide() test shares: run a claim's decide() on a copy of hand-made measurements and check the
verdict it gives (tests/test_decide*.py)."""
import copy
import importlib

import pytest


def decide_of(name):
    mod = importlib.import_module(f"attnlab.experiments.{name}")
    if not hasattr(mod, "decide"):
        pytest.skip(f"{name} has no decide() yet")
    return mod.decide


def check(name, measured, expected):
    d = decide_of(name)(copy.deepcopy(measured))
    assert d.verdict == expected, (d.verdict, d.reasons)
    assert d.figure and d.reasons and all(isinstance(r, str) and r for r in d.reasons)
    return d


def changed(base, fn):
    """A deep copy of ``base`` with ``fn`` applied to it."""
    m = copy.deepcopy(base)
    fn(m)
    return m

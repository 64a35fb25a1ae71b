"""attnlab.timing: the one clock every measurement reads, on real work (no mocked clock)."""
from __future__ import annotations

import pytest
import torch

from attnlab import timing


def test_time_calls_warms_up_then_times_each_repeat_per_call():
    calls, checks = [], []
    t = timing.time_calls(lambda: calls.append(1), repeats=4, warmup=2, inner=3, before=lambda: checks.append(1))
    assert len(calls) == 2 + 4 * 3 and len(checks) == 1 + 4  # once before the warm-up, once before each repeat
    assert 0 <= t["min_s"] <= t["lo_s"] <= t["median_s"] <= t["hi_s"] <= t["max_s"] and t["repeats"] == 4
    assert t["cpu_s"] >= 0


def test_time_calls_measures_the_work_not_a_constant():
    """A product 8x the FLOPs takes longer on the same clock: the figure follows the work."""
    small, big = torch.randn(128, 128), torch.randn(256, 256)
    ts = timing.time_calls(lambda: small @ small, 9, 2)["median_s"]
    tb = timing.time_calls(lambda: big @ big, 9, 2)["median_s"]
    assert tb > 2 * ts


def test_a_cancel_check_stops_before_the_next_repeat():
    class Stop(Exception):
        pass

    seen = []

    def before():
        if len(seen) >= 2:
            raise Stop
    with pytest.raises(Stop):
        timing.time_calls(lambda: seen.append(1), repeats=10, warmup=1, before=before)
    assert len(seen) == 2  # the warm-up and one repeat, then the check refused the next


def test_machine_limits_are_plausible_figures():
    """Bytes per second of a sum and FLOP/s of a matmul: within what any machine this runs on can do."""
    assert 1e8 < timing.memory_bandwidth(16 * 2**20, repeats=3) < 1e13
    assert 1e8 < timing.matmul_peak(n=256, seconds=0.05) < 1e16
    assert timing.matmul_peak(n=256, seconds=0.05, onednn=True) > 0
    speed = timing.host_speed(n=128, repeats=3)
    assert speed["matmul_gflops_best"] >= speed["matmul_gflops"] > 0


def test_paired_ratios_alternate_which_side_goes_first():
    order = []
    num = lambda: order.append("a") or 3.0  # noqa: E731
    den = lambda: order.append("b") or 2.0  # noqa: E731
    assert timing.paired_ratios(num, den, 4) == [1.5] * 4
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_timed_read_follows_the_bytes_it_reads():
    """A read of 64x the bytes takes longer on the same clock (medians of paired calls): it times the memory traffic."""
    small, big = timing.timed_read(2**20), timing.timed_read(64 * 2**20)
    ratios = sorted(timing.paired_ratios(big, small, 9))
    assert ratios[4] > 4


def test_timed_step_times_one_decode_step_and_rolls_its_cache_back():
    from attnlab.config import ModelConfig
    from attnlab.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, max_seq_len=64), "cpu").eval()
    prompt = list(range(1, 21))
    short, long = timing.timed_step(model, prompt[:4]), timing.timed_step(model, prompt)
    # repeatable: the cache has room for one step past the prompt, so without the rollback a second call raises
    assert all(short() > 0 and long() > 0 for _ in range(3))
    verify = timing.timed_step(model, prompt, rows=4)
    assert verify() > 0


def test_peak_memory_sees_what_was_held_in_its_window_only():
    held = torch.ones(16 * 2**20)  # 64 MiB, held from before the second window
    window = timing.PeakMemory().start()
    extra = torch.ones(32 * 2**20)  # 128 MiB, touched inside the first window
    peak = window.peak_bytes()
    del extra
    quiet = timing.PeakMemory().start().peak_bytes()
    if timing.resident_bytes() is None:
        pytest.skip("no procfs here: resident bytes cannot be read")
    assert peak >= 100 * 2**20 and quiet < 32 * 2**20
    assert held.sum() > 0


def test_run_fresh_runs_in_another_process_and_names_a_failure():
    import os

    pid = timing.run_fresh("os", "getpid", [], threads=1)
    assert isinstance(pid, int) and pid != os.getpid()
    with pytest.raises(RuntimeError, match="the square root of a word"):
        timing.run_fresh("math", "sqrt", ["word"], threads=1, what="the square root of a word")

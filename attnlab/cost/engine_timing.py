"""The engine timed as a whole, from outside, as a user waits for it (``time_generate``), and the pace of the
machine beside it (``Pulse``): the calibration's overhead probe (``probe``, a 16-wide model) and ``attnlab cost
--validate``'s cases use them. The per-kernel micro-benchmarks are in calibrate.py."""
from __future__ import annotations

import statistics
import time

import torch

from attnlab.cost.calibrate import CALIBRATION, MiB, _time


def _probe_config(layers: int):
    from attnlab.config import ModelConfig

    p = CALIBRATION["probe"]
    return ModelConfig(dim=p["dim"], n_layers=layers, n_heads=p["n_heads"], vocab_size=p["vocab_size"],
                       max_seq_len=p["prompt"] + p["new_tokens"] + 8)


class Pulse:
    """A 15 ms reference of the machine's pace, one figure per kind of work, on plain torch kernels (no layout
    chosen by measurement: every process runs the same ones): ``fp32`` and ``bf16`` (a 320 x 320 by 320 x 1280
    matmul in each dtype, a calibration shape), ``memory`` (the sum of 64 MiB) and ``dispatch`` (100 additions of
    16 numbers).

    Why: on this shared machine the pace changes within seconds, even in CPU time: the same bf16 matmul ran at
    490, 1220 and 780 GFLOP/s in one process a few seconds apart (other tenants share the cores' matrix units
    and caches). Timed between the calibration's benchmarks and between a validation case's repeats, the ratio of
    its medians says how much faster or slower each kind of work ran during the case than during the calibration
    (MEASURING.md: calibrate in the same run)."""

    def __init__(self, dtypes=("fp32", "bf16")):
        a, b = torch.randn(320, 320), torch.randn(320, 1280)
        big = torch.ones(16 * MiB)
        x, y = torch.ones(16), torch.ones(16)

        def dispatch():
            for _ in range(100):
                x + y
        self._fns = {"memory": (lambda: big.sum(), 1), "dispatch": (dispatch, 2)}
        for d, (ad, bd) in {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}.items():
            if d in dtypes:
                self._fns[d] = (lambda ad=ad, bd=bd: ad @ bd, 3)
        self.samples = {k: [] for k in self._fns}

    def __call__(self) -> None:
        for kind, (fn, inner) in self._fns.items():
            self.samples[kind].append(_time(fn, repeats=3, warm=1, inner=inner))

    def medians(self) -> dict:
        """{clock: {kind: median seconds}}."""
        return {clock: {k: statistics.median(t[clock] for t in v) for k, v in self.samples.items()}
                for clock in ("wall", "cpu")}


def time_generate(model, prompts: list[list[int]], new_tokens: int, repeats: int, min_warm_s: float = 0.5,
                  pulse: Pulse | None = None) -> dict:
    """Wall and CPU seconds of the engine's generate(), timed from outside, as the user waits for it:
    TTFT = a call that returns one new token; per-step decode = (a call for ``new_tokens`` - the call for one just
    before it) / (new_tokens - 1). The two calls alternate, after a warm-up of both; the median TTFT and the median
    of the pairs' differences.
    A ``pulse`` is timed after the warm-up and after each pair (its medians are returned under "pulse")."""
    from attnlab.engine import generate

    def call(n):
        w, c = time.perf_counter(), time.process_time()
        generate(model, prompts, n)
        return time.perf_counter() - w, time.process_time() - c

    start, warm = time.perf_counter(), 0
    while warm < 1 or time.perf_counter() - start < min_warm_s:  # thread pools, allocator, first touch
        call(1)
        call(new_tokens)
        warm += 1
    if pulse is not None:
        pulse()
    one, many = [], []
    for _ in range(repeats):
        one.append(call(1))
        many.append(call(new_tokens))
        if pulse is not None:
            pulse()
    out = {"pulse": pulse.medians()} if pulse is not None else {}
    for k, clock in enumerate(("wall", "cpu")):
        # Decode from each pair's own difference (the two calls ran back to back), then the median: a difference
        # of two medians mixed calls from different moments of a noisy host, and where the prefill dwarfs the
        # decode steps (a 1,024-token bf16 prompt, 16 steps) it once came out negative (-0.46 ms a step).
        out[clock] = {"ttft": statistics.median(x[k] for x in one),
                      "decode": statistics.median(b[k] - a[k] for a, b in zip(one, many)) / (new_tokens - 1)}
    out["spread"] = {"ttft_min": min(x[0] for x in one), "ttft_max": max(x[0] for x in one),
                     "many_min": min(x[0] for x in many), "many_max": max(x[0] for x in many)}
    return out


def op_counts(cfg, batch: int, prompt: int, context: int, dtype: str = "fp32") -> dict:
    """The tracer's op and matmul counts of the engine's prefill and of one decode step (trace.engine_ops)."""
    from attnlab.cost.trace import engine_ops

    ops = engine_ops(cfg, batch, prompt, context, dtype)
    return {"prefill": ops["prefill"].ops, "decode": ops["decode"].ops,
            "prefill_matmuls": ops["prefill"].matmul_ops, "decode_matmuls": ops["decode"].matmul_ops}


def probe() -> dict:
    """Engine timings of the tiny probe model (fp32): [[layers, batch, timings, ops]], ops = the tracer's counts
    {"prefill": n, "decode": n, "prefill_matmuls": n, "decode_matmuls": n}."""
    from attnlab.engine.quantize import set_precision
    from attnlab.models import build_model

    p = CALIBRATION["probe"]
    rows = []
    for layers in p["layers"]:
        for batch in p["batch"]:
            if batch > 1 and layers > min(p["layers"]):
                continue
            cfg = _probe_config(layers)
            torch.manual_seed(0)
            model = set_precision(build_model(cfg), "fp32", rows=batch)
            g = torch.Generator().manual_seed(0)
            prompts = [torch.randint(0, cfg.vocab_size, (p["prompt"],), generator=g).tolist() for _ in range(batch)]
            t = time_generate(model, prompts, p["new_tokens"], repeats=5)
            rows.append([layers, batch, t, op_counts(cfg, batch, p["prompt"], p["prompt"] + p["new_tokens"] // 2)])
    return {"rows": rows}

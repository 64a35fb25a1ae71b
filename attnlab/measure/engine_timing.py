"""The engine timed as a whole, from outside, as a user waits for it (``time_generate``), and the pace of the
machine beside it (``Pulse``): the calibration's overhead probe (``probe``, a 16-wide model) and ``attnlab cost
--validate``'s cases use them. The per-kernel micro-benchmarks are run by calibrate.py (the *_tables.py modules)."""
from __future__ import annotations

import statistics
import time

import torch

from attnlab.measure.micro import CALIBRATION, MiB, timed


def _probe_config(layers: int):
    from attnlab.config import ModelConfig

    p = CALIBRATION["probe"]
    return ModelConfig(dim=p["dim"], n_layers=layers, n_heads=p["n_heads"], vocab_size=p["vocab_size"],
                       max_seq_len=p["prompt"] + p["new_tokens"] + 8)


class Pulse:
    """A ~150 ms reference of the machine's pace, one figure per kind of work, on plain torch kernels (no layout
    chosen by measurement: every process runs the same ones): ``fp32`` and ``bf16`` (a 320 x 320 by 320 x 1280
    matmul in each dtype, a calibration shape), ``memory`` (sums of four 128 MiB buffers in turn) and ``dispatch`` (100 additions of
    16 numbers).

    The memory sums read 512 MiB a call, more than a server CPU's last-level cache, so each buffer has left the
    cache by the time it is read again, whatever ran before: a single sum small enough to stay cached measures what
    ran before it rather than the pace (docs/cost.md has the figures that showed it).

    Why: on a shared machine the pace changes within seconds, even in CPU time (other tenants share the cores'
    matrix units and caches; docs/cost.md records the spread seen). Timed between the calibration's benchmarks and between a validation case's repeats, the ratio of
    its medians says how much faster or slower each kind of work ran during the case than during the calibration
    (MEASURING.md: calibrate in the same run)."""

    def __init__(self, dtypes=("fp32", "bf16")):
        a, b = torch.randn(320, 320), torch.randn(320, 1280)
        bufs = [torch.ones(32 * MiB) for _ in range(4)]  # 4 x 128 MiB of fp32
        x, y = torch.ones(16), torch.ones(16)

        def dispatch():
            for _ in range(100):
                x + y
        self._fns = {"memory": (lambda: [b.sum() for b in bufs], 1), "dispatch": (dispatch, 2)}
        for d, (ad, bd) in {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}.items():
            if d in dtypes:
                self._fns[d] = (lambda ad=ad, bd=bd: ad @ bd, 3)
        self.samples = {k: [] for k in self._fns}

    def __call__(self) -> None:
        for kind, (fn, inner) in self._fns.items():
            self.samples[kind].append(timed(fn, repeats=3, warm=1, inner=inner))

    def medians(self) -> dict:
        """{clock: {kind: median seconds}}."""
        return {clock: {k: statistics.median(t[clock] for t in v) for k, v in self.samples.items()}
                for clock in ("wall", "cpu")}


def stamped_generate(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """One generation as ``engine.generate`` runs it (an Engine sized for the batch, stepped until every request is
    done), with both clocks read before the engine exists, when every sequence has its first token, and at the end:
    {clock: (ttft, decode)}, decode = the rest of the call over the tokens it added per sequence. The prefill runs
    as a step of its own (``step(decode=False)``): generate()'s first step also takes every sequence's second
    token, which a TTFT read after it would include (a decode step is a large share of a short prefill)."""
    from attnlab.engine.engine import Engine, EngineConfig
    from attnlab.engine.request import Request

    w0, c0 = time.perf_counter(), time.process_time()
    engine = Engine(model, EngineConfig(max_batch=len(prompts), max_len=max(len(p) for p in prompts) + new_tokens,
                                        paged=False, prefix_reuse=False))
    ids = [engine.add(Request(list(p), new_tokens)) for p in prompts]
    counts = dict.fromkeys(ids, 0)  # tokens each request has
    while not all(counts.values()):  # the prefill alone (a step would also decode the finished prompts)
        for e in engine.step(decode=False):
            counts[e.id] += e.token is not None
    first = time.perf_counter(), time.process_time(), min(counts.values())
    while engine.has_work:
        for e in engine.step():
            counts[e.id] += e.token is not None
    w1, c1 = time.perf_counter(), time.process_time()
    steps = min(counts.values()) - first[2]
    return {"wall": (first[0] - w0, (w1 - first[0]) / max(steps, 1)),
            "cpu": (first[1] - c0, (c1 - first[1]) / max(steps, 1))}


def time_generate(model, prompts: list[list[int]], new_tokens: int, repeats: int, min_warm_s: float = 0.5,
                  pulse: Pulse | None = None) -> dict:
    """Wall and CPU seconds of the engine's generation as the user waits for it, both from the same calls
    (``stamped_generate``): TTFT, and the decode time per step from the steps after the first token (TPOT). The
    median over ``repeats`` calls, after a warm-up; a ``pulse`` is timed after the warm-up and after each call (its
    medians are returned under "pulse").

    Why per-step stamps: a difference of two calls ((a call for ``new_tokens`` - a call for one) / (new_tokens - 1))
    lets the prefill's noise drown the steps where the prefill dwarfs them (a 2,048-token prompt against 16 short
    steps), down to negative step times; stamps inside one call time the steps alone."""
    start, warm = time.perf_counter(), 0
    while warm < 2 or time.perf_counter() - start < min_warm_s:  # thread pools, allocator, first touch
        stamped_generate(model, prompts, new_tokens)
        warm += 1
    if pulse is not None:
        pulse()
    calls = []
    for _ in range(repeats):
        calls.append(stamped_generate(model, prompts, new_tokens))
        if pulse is not None:
            pulse()
    out = {"pulse": pulse.medians()} if pulse is not None else {}
    for clock in ("wall", "cpu"):
        out[clock] = {"ttft": statistics.median(c[clock][0] for c in calls),
                      "decode": statistics.median(c[clock][1] for c in calls)}
    out["spread"] = {"ttft_min": min(c["wall"][0] for c in calls), "ttft_max": max(c["wall"][0] for c in calls),
                     "decode_min": min(c["wall"][1] for c in calls), "decode_max": max(c["wall"][1] for c in calls)}
    return out


def time_model(cfg, dtype: str, batch: int, prompt: int, new_tokens: int, repeats: int, min_warm_s: float = 0.5,
               pulse: Pulse | None = None) -> dict:
    """``time_generate`` of a model of ``cfg`` with random weights (seed 0: the same in every run), set to ``dtype``
    for ``batch`` rows as a server would (set_precision), on ``batch`` random prompts of ``prompt`` tokens."""
    from attnlab.engine.quantize import set_precision
    from attnlab.models import build_model

    torch.manual_seed(0)
    model = set_precision(build_model(cfg), dtype, rows=batch)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (prompt,), generator=g).tolist() for _ in range(batch)]
    return time_generate(model, prompts, new_tokens, repeats, min_warm_s=min_warm_s, pulse=pulse)


def time_model_json(cfg: dict, dtype: str, batch: int, prompt: int, new_tokens: int, repeats: int) -> dict:
    """``time_model`` on a ModelConfig given as a dict (what a fresh process receives: timing.run_fresh)."""
    from attnlab.config import ModelConfig

    with torch.inference_mode():
        return time_model(ModelConfig(**cfg), dtype, batch, prompt, new_tokens, repeats, min_warm_s=1.0)


def op_counts(cfg, batch: int, prompt: int, context: int, dtype: str = "fp32") -> dict:
    """The tracer's op and matmul counts of the engine's prefill and of one decode step (trace.engine_ops)."""
    from attnlab.measure.trace import engine_ops

    ops = engine_ops(cfg, batch, prompt, context, dtype)
    return {"prefill": ops["prefill"].ops, "decode": ops["decode"].ops,
            "prefill_matmuls": ops["prefill"].matmul_ops, "decode_matmuls": ops["decode"].matmul_ops}


def probe() -> dict:
    """Engine timings of the tiny probe model (fp32): [[layers, batch, timings, ops]], ops = the tracer's counts
    {"prefill": n, "decode": n, "prefill_matmuls": n, "decode_matmuls": n}."""
    p = CALIBRATION["probe"]
    rows = []
    for layers in p["layers"]:
        for batch in p["batch"]:
            if batch > 1 and layers > min(p["layers"]):
                continue
            cfg = _probe_config(layers)
            t = time_model(cfg, "fp32", batch, p["prompt"], p["new_tokens"], repeats=5)
            rows.append([layers, batch, t, op_counts(cfg, batch, p["prompt"], p["prompt"] + p["new_tokens"] // 2)])
    return {"rows": rows}

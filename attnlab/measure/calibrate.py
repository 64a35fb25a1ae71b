"""Micro-benchmarks that calibrate the ``local`` hardware spec, at shapes no validated model uses.

Each benchmark runs one kind of kernel the engine runs, through the engine's own modules, at the shapes listed
in ``micro.CALIBRATION``, and nothing else: never a whole model of a validated size. (The overhead probe is a
whole model, but one 16 wide, which ``attnlab cost --validate`` never validates.) What is measured:

- ``linear_prefill``: seconds for one layer's four matrices (W x 3W, W x W, W x 4W, 4W x W, through DenseLinear)
  on M rows, by dtype: the FLOP/s a prefill's matmuls reach, by row count and width;
- ``linear_decode``: seconds for a row or a few rows times many such sets, cycled, whose weights add up to a
  working set of 1 to 640 MiB: the bytes/s a decode step's weight streaming reaches, from cache or from DRAM;
- ``attention``: seconds of one causal SDPA call over T tokens (prefill), and of one query over S cached fp32 keys
  (decode) through the engine's decode kernel;
- ``elementwise``: seconds for one layer's non-matmul kernels (two layer norms, two adds, rotary on q and k,
  GELU) on M rows of width W;
- ``head``: seconds of the LM head (W x HEAD_VOCAB through DenseLinear, read hot) on a row or a few, and of the
  engine's greedy sampler over those rows' logits (sampling.greedy_rows: fp32 copy, finiteness, argmax, log-probability),
  by dtype: a head of a large vocabulary is a wide, skinny product whose few rows can be bound by arithmetic
  rather than by its bytes, and the sampler passes over every logit several times;
- ``floors``: each of the above at a tiny shape, where only the cost of calling it is left;
- ``cold_dispatch``: the floor's tiny kernels just after 0 to 32 MiB were streamed through the caches: how
  much dearer dispatching gets when a big matmul has just evicted what it needs;
- ``probe`` (engine_timing.py): a 16-wide transformer of 1 and 16 layers, run by the engine (1 and 6
  sequences): the fixed cost of each dispatched op and of each engine step;
- ``memory``: the bandwidth of a large sum (reading) and of first-touch writes to fresh zeros (a new KV cache);
- ``composition``: two whole models (160 and 800 wide, 6 layers, widths no validation draws) run by the engine in fresh
  processes, beside the sum of their parts as ``cost.cpu`` predicts it from the tables above: how much the
  engine's sequence of kernels costs beyond the same kernels timed one at a time;
- ``pulse``: a 150 ms reference of the machine's pace (``engine_timing.Pulse``), timed between the benchmarks,
  which a validation times again beside each case.

Every figure is the median of its repeats after a warm-up, kept on two clocks: wall time (what a user waits
for) and the process's CPU time (what the work took while it had a core; on a shared machine the two part).
The model that turns these into predicted times is ``cost.cpu``.
"""
from __future__ import annotations

import threading
import time

import torch

from attnlab.measure import micro
from attnlab.measure.attention_tables import attention_tables
from attnlab.measure.composition import composition
from attnlab.measure.elementwise_tables import ELEMENT_CAP, cold_dispatch, elementwise_table
from attnlab.measure.engine_timing import Pulse, probe
from attnlab.measure.matmul_tables import PREFILL_FLOP_CAP, head_table, linear_tables
from attnlab.measure.micro import CALIBRATION, MiB, timed


def memory() -> dict:
    """Read bandwidth of a 256 MiB sum; first-touch write bandwidth of a fresh 64 MiB zeros tensor (what a new KV
    cache costs: the pages are mapped and zeroed as they are first written)."""
    x = torch.ones(64 * MiB)  # 256 MiB
    read = timed(lambda: x.sum(), repeats=5)
    n = 16 * MiB  # 64 MiB of fp32

    def touch():
        torch.zeros(n).fill_(1.0)
    first = timed(touch, repeats=5)
    warm_fill = torch.zeros(n)
    fill = timed(lambda: warm_fill.fill_(1.0), repeats=5)
    return {"read_bytes": x.numel() * 4, "read": read, "touch_bytes": n * 4, "touch": first, "fill": fill}


def shapes() -> set[tuple]:
    """Every shape a calibration micro-benchmark runs, in the vocabulary of validate.case_shapes:
    ("linear", rows, in, out), ("attention", T queries, S keys, head_dim), ("elementwise", rows, width),
    ("model", dim, n_layers)."""
    c = CALIBRATION
    out = set()

    def layer(rows, W):
        out.update(("linear", rows, i, o) for o, i in ((3 * W, W), (W, W), (4 * W, W), (W, 4 * W)))
    layer(1, c["floor_width"])
    for W in c["widths"]:
        for M in c["prefill_rows"]:
            if 24 * M * W * W <= PREFILL_FLOP_CAP:
                layer(M, W)
        for rows in c["decode_rows"]:
            layer(rows, W)
            out.add(("linear", rows, W, c["head_vocab"]))
        out.update(("elementwise", M, W) for M in c["elementwise_rows"] if M * 4 * W <= ELEMENT_CAP)
    out.add(("elementwise", 1, c["floor_width"]))
    out.update({("attention", 8, 8, 8), ("attention", 1, 8, 8)})
    for D in c["attention_head_dims"]:
        out.update(("attention", T, T, D) for T in c["attention_tokens"])
        out.update(("attention", 1, S, D) for S in c["attention_keys"])
    p = c["probe"]
    out.update(("model", p["dim"], L) for L in p["layers"])
    comp = c.get("composition")
    for dim, heads, layers in comp["models"] if comp else ():
        B, T, D = comp["batch"], comp["prompt"], dim // heads
        out.add(("model", dim, layers))
        for rows in (B * T, B):
            layer(rows, dim)
            out.add(("elementwise", rows, dim))
        out.add(("attention", T, T, D))
        out.update(("attention", 1, S, D) for S in range(T + 1, T + comp["new_tokens"] + 1))
    return out

def run(dtypes: tuple[str, ...], modules: dict | None = None, cancel: threading.Event | None = None,
        composed: dict | None = None) -> dict:
    """Every micro-benchmark, for ``dtypes``; the raw figures ``cost.cpu`` reads. ``modules``: see linear_tables.
    ``cancel``: once set (from another thread), the run raises ``Cancelled`` before its next timed repeat.
    ``composed``: an earlier calibration's ``composition`` in the same process, whose whole-model timings are kept
    instead of running the models again, predicted afresh from this calibration's tables (composition)."""
    micro.watch(cancel)
    try:
        return _run(dtypes, modules, composed)
    finally:
        micro.watch(None)


def _run(dtypes: tuple[str, ...], modules: dict | None, composed: dict | None = None) -> dict:
    t0 = time.perf_counter()
    out, took = {}, {}
    with torch.inference_mode():
        pulse = Pulse(dtypes)
        pulse()
        for name, bench in (("probe", probe), ("linear", lambda: linear_tables(dtypes, modules, pulse)),
                            ("attention", lambda: attention_tables(dtypes)), ("head", lambda: head_table(dtypes, modules)),
                            ("elementwise", lambda: elementwise_table(dtypes)), ("cold_dispatch", cold_dispatch),
                            ("memory", memory)):
            t = time.perf_counter()
            out[name] = bench()
            took[name] = time.perf_counter() - t
            pulse()  # between the benchmarks: its medians are the machine's pace over the calibration
    from attnlab import kernels

    out["pulse"] = pulse.medians()
    out["compiled_kernels"] = kernels.native() is not None  # which decode attention the cache's dtype follows
    out["dtypes"] = list(dtypes)
    out["shapes"] = CALIBRATION
    t = time.perf_counter()
    out["composition"] = composition(dtypes, out, composed)  # last: it predicts from every other table
    took["composition"] = time.perf_counter() - t
    out["seconds_by_benchmark"] = took
    out["seconds"] = time.perf_counter() - t0
    return out

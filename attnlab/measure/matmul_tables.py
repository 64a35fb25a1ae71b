"""The calibration's matmul tables (calibrate.py runs them): one transformer layer's four matrices through the
engine's own modules (DenseLinear, Int8Linear), at prefill row counts (FLOP/s) and at decode's few rows over working
sets of 1 to 640 MiB (bytes/s); and the LM head with the greedy sampler over its logits."""
from __future__ import annotations

import torch
from torch import nn

from attnlab.cost.cpu import SAMPLE_FLOOR_LOGITS
from attnlab.measure.micro import CALIBRATION, MiB, floor_timed, timed

PREFILL_FLOP_CAP = 1.3e10  # FLOPs of one timed set: keeps the table to seconds on a 2-core machine
PREFILL_SETS = 2  # distinct layer sets the prefill table cycles through
MAX_SETS = 200  # copies of one set at most (the narrowest stay within the caches, as a small model's do)


def _layer_set(W: int, dtype: str, rows: int = 1) -> list[nn.Module]:
    """One transformer layer's four matrices at width W, as the engine runs them (set_precision's modules)."""
    from attnlab.engine.quantize import DTYPES, DenseLinear, Int8Linear

    out = []
    for o, i in ((3 * W, W), (W, W), (4 * W, W), (W, 4 * W)):
        lin = torch.nn.utils.skip_init(nn.Linear, i, o, bias=False)  # values do not change a kernel's speed: no
        with torch.no_grad():                                          # random init (seconds at W = 1280)
            lin.weight.fill_(0.01)
        out.append(Int8Linear(lin, torch.bfloat16) if dtype == "int8" else DenseLinear(lin, DTYPES[dtype], rows))
    return out


def _run_sets(sets: list[list[nn.Module]], rows: int, W: int, act_dtype) -> callable:
    x, xh = torch.randn(rows, W).to(act_dtype), torch.randn(rows, 4 * W).to(act_dtype)

    def fn():
        for s in sets:
            for m in s:
                m(xh if m.in_features == 4 * W else x)
    return fn


def linear_tables(dtypes: tuple[str, ...], modules: dict | None = None, between=None) -> dict:
    """{dtype: {"prefill": [[W, M, s]], "decode": [[W, rows, bytes, s]], "floor": s}} (seconds per layer set).
    ``modules``: a dict that keeps the matrices built here for the next calibration in the same process (building
    them is most of this table's time; a validation calibrates three times). ``between()`` is called after each
    dtype's tables (the pulse)."""
    from attnlab.engine.quantize import DTYPES

    modules = {} if modules is None else modules

    def sets(W, dtype, rows, n):
        have = modules.setdefault((W, dtype, rows), [])
        have += [_layer_set(W, dtype, rows) for _ in range(n - len(have))]
        return have[:n]

    out = {}
    for dtype in dtypes:
        act = DTYPES[dtype]
        nbytes = {"fp32": 4, "bf16": 2, "int8": 1}[dtype]
        floor = floor_timed(_run_sets(sets(CALIBRATION["floor_width"], dtype, 1, 1), 1, CALIBRATION["floor_width"],
                                      act))
        prefill, decode = [], []
        for W in CALIBRATION["widths"]:
            # Two sets in turn, per set: a prefill's next layer has its own weights, and one set timed alone would
            # read its weights hot (faster than distinct ones: docs/cost.md).
            two = sets(W, dtype, 1, PREFILL_SETS)
            for M in CALIBRATION["prefill_rows"]:
                if 24 * M * W * W > PREFILL_FLOP_CAP:
                    continue
                t = timed(_run_sets(two, M, W, act), repeats=5)
                prefill.append([W, M, {k: v / len(two) for k, v in t.items()}])
            set_bytes = 12 * W * W * nbytes
            counts = sorted({min(max(1, round(ws * MiB / set_bytes)), MAX_SETS)
                             for ws in CALIBRATION["working_sets_mib"]})
            for rows in CALIBRATION["decode_rows"]:
                laid = sets(W, dtype, rows, counts[-1])  # laid out for `rows`, as decode's are
                for n in counts:  # the first n sets, cycled: a working set of n sets
                    t = timed(_run_sets(laid[:n], rows, W, act), repeats=5)
                    decode.append([W, rows, n * set_bytes, {k: v / n for k, v in t.items()}])
        out[dtype] = {"prefill": prefill, "decode": decode, "floor": floor}
        if between is not None:
            between()
    return out


def head_table(dtypes: tuple[str, ...], modules: dict | None = None) -> dict:
    """{dtype: {"head": [[W, rows, s]], "sample": [[rows, s]], "sample_floor": [[rows, s]]}}: the LM head of
    CALIBRATION["head_vocab"] outputs at each width, laid out for ``rows`` (hot: the cost model takes the larger of
    this and the weights' streaming time, cost.cpu._head_s), and the greedy sampler over its logits, and over
    SAMPLE_FLOOR_LOGITS logits (the sampler's dispatch, which the probe's per-op cost already carries). ``modules``: as in
    linear_tables (laying a head out is most of this table's time: DenseLinear times its candidate layouts)."""
    from attnlab.engine.quantize import DTYPES, DenseLinear
    from attnlab.engine.sampling import greedy_rows

    V, out, modules = CALIBRATION["head_vocab"], {}, {} if modules is None else modules
    for dtype in dtypes:
        act, head, sample, floor = DTYPES[dtype], [], [], []
        for rows in CALIBRATION["decode_rows"]:
            for W in CALIBRATION["widths"]:
                m = modules.get(("head", W, dtype, rows))
                if m is None:
                    lin = torch.nn.utils.skip_init(nn.Linear, W, V, bias=False)
                    with torch.no_grad():
                        lin.weight.fill_(0.01)
                    m = modules[("head", W, dtype, rows)] = DenseLinear(lin, act, rows)
                x = torch.randn(rows, W).to(act)
                head.append([W, rows, timed(lambda: m(x), repeats=5, inner=3)])
            logits = torch.randn(rows, V).to(act)
            sample.append([rows, timed(lambda: greedy_rows(logits), repeats=5, inner=5)])
            tiny = torch.randn(rows, SAMPLE_FLOOR_LOGITS).to(act)
            floor.append([rows, floor_timed(lambda: greedy_rows(tiny), repeats=5)])
        out[dtype] = {"head": head, "sample": sample, "sample_floor": floor}
    return out

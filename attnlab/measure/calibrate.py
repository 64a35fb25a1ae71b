"""Micro-benchmarks that calibrate the ``local`` hardware spec, at shapes no validated model uses.

Each benchmark runs one kind of kernel the engine runs, through the engine's own modules, at the shapes listed
in ``CALIBRATION`` below, and nothing else: never a whole model of a validated size. (The overhead probe is a
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

import statistics
import threading
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.cost.cpu import SAMPLE_FLOOR_LOGITS
from attnlab.measure import micro
from attnlab.measure.engine_timing import Pulse, probe
from attnlab.measure.micro import CALIBRATION, MiB, timed

PREFILL_FLOP_CAP = 1.3e10  # FLOPs of one timed set: keeps the table to seconds on a 2-core machine
PREFILL_SETS = 2  # distinct layer sets the prefill table cycles through
ELEMENT_CAP = 2 * 2 ** 20
ATTENTION_COLD_BYTES = 64 * MiB  # decode attention is also timed over distinct caches adding up to this
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
        floor = timed(_run_sets(sets(CALIBRATION["floor_width"], dtype, 1, 1), 1, CALIBRATION["floor_width"], act),
                      repeats=7, inner=20)
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
            floor.append([rows, timed(lambda: greedy_rows(tiny), repeats=5, inner=20)])
        out[dtype] = {"head": head, "sample": sample, "sample_floor": floor}
    return out


def _sdpa(B: int, H: int, T: int, S: int, D: int, dtype, copies: int = 1) -> callable:
    """One call of the engine's ``sdpa`` kernel (causal when T == S; attnlab's compiled prefill attention where it
    applies, as in the engine's prefill, else torch's SDPA), or ``copies`` calls over distinct keys and values in
    turn (a decode step reads every layer's cache: from DRAM once they outgrow the caches)."""
    from attnlab.models.attention import sdpa_attention

    q = torch.randn(B, H, T, D, dtype=dtype)
    kvs = [(torch.randn(B, H, S, D, dtype=dtype), torch.randn(B, H, S, D, dtype=dtype)) for _ in range(copies)]
    causal = T == S and T > 1

    def fn():
        with torch.no_grad():
            for k, v in kvs:
                sdpa_attention(q, k, v, causal=causal, alibi_slopes=None, scale=D ** -0.5)
    return fn


def _decode_attention(H: int, S: int, D: int, copies: int = 1) -> callable:
    """One query over S cached fp32 keys, or ``copies`` calls over distinct caches in turn, through the kernel the
    engine's decode steps use: attnlab's compiled decode attention (kernels/decode_attention.cpp, which the block
    step calls) where it is built, else SDPA."""
    from attnlab import kernels

    mod = kernels.native()
    if mod is None:
        return _sdpa(1, H, 1, S, D, torch.float32, copies)
    q = torch.randn(1, H, D)
    kvs = [(torch.randn(1, H, S, D), torch.randn(1, H, S, D)) for _ in range(copies)]
    lens, none = torch.tensor([S]), torch.empty(0, dtype=torch.long)

    def fn():
        for k, v in kvs:
            mod.decode_attention(q, k, v, *k.stride()[:3], none, 0, lens, H, D ** -0.5)
    return fn


def attention_tables(dtypes: tuple[str, ...] = ("fp32",)) -> dict:
    """{"prefill": {dtype: [[T, D, s]]}, "decode": [[S, D, bytes cycled, s per call]], "floor": {"prefill": {dtype:
    s}, "decode": s}} for CALIBRATION's head count, batch 1. Prefill in fp32, and in bf16 where ``dtypes`` has bf16
    or int8 (their prefill attends in the cache's bf16 where attnlab's kernels are built: cpu.attention_dtype; bf16
    SDPA runs at its own pace, much slower than fp32's where a CPU lacks bf16 matrix units). Decode with an fp32 cache (a bf16 cache is predicted
    at the same bytes/s: cpu.decode_s counts its bytes). Prefill is the engine's causal ``sdpa`` kernel (_sdpa);
    decode is the engine's
    decode kernel (_decode_attention), timed over one cache (from the CPU's caches) and over distinct caches adding
    up to 64 MiB (DRAM; at most 200 of them: the smallest stay within the caches, as a small model's do)."""
    H = CALIBRATION["attention_heads"]
    f32 = torch.float32
    decode = []
    for S in CALIBRATION["attention_keys"]:
        for D in CALIBRATION["attention_head_dims"]:
            per = 2 * H * S * D * 4
            for copies in sorted({1, min(max(1, round(ATTENTION_COLD_BYTES / per)), 200)}):
                t = timed(_decode_attention(H, S, D, copies), repeats=5, inner=max(1, 10 // copies))
                decode.append([S, D, copies * per, {k: v / copies for k, v in t.items()}])
    kinds = {"fp32": f32, **({"bf16": torch.bfloat16} if {"bf16", "int8"} & set(dtypes) else {})}
    return {"prefill": {k: [[T, D, timed(_sdpa(1, H, T, T, D, dt), repeats=5)]
                            for T in CALIBRATION["attention_tokens"] for D in CALIBRATION["attention_head_dims"]]
                        for k, dt in kinds.items()},
            "decode": decode,
            "floor": {"prefill": {k: timed(_sdpa(1, H, 8, 8, 8, dt), repeats=7, inner=20) for k, dt in kinds.items()},
                      "decode": timed(_decode_attention(H, 8, 8), repeats=7, inner=50)}}


def _elementwise_mix(M: int, W: int, dtype) -> callable:
    """One layer's non-matmul kernels on M rows, as attnlab runs them: two layer norms, two residual adds, rotary on
    q and k, tanh-GELU on the 4W hidden layer, the attention output's copy back to (M, W) (none in fp32 where the
    compiled prefill attention writes it merged), keys and values written
    into an fp32 cache, and with weights narrower than fp32 the queries widened to fp32 and the output narrowed
    back (timed so whatever the cache's dtype: a copy's cost, per element)."""
    from attnlab import kernels
    from attnlab.models.layers import gelu_tanh_
    from attnlab.models.positional import apply_rotary

    H, f32 = 4, torch.float32
    mod = kernels.native()  # fp32 heads the compiled prefill attention takes: it writes (M, H, D), merged
    merge_copy = dtype != f32 or mod is None or (W // H) % mod.lanes() or (W // H) // mod.lanes() > 8
    x, y = torch.randn(M, W, dtype=dtype), torch.randn(M, W, dtype=dtype)
    h = torch.randn(M, 4 * W, dtype=dtype)
    q = torch.randn(1, H, M, W // H, dtype=dtype)
    cos, sin = torch.randn(M, W // H, dtype=dtype), torch.randn(M, W // H, dtype=dtype)
    out = torch.randn(1, H, M, W // H, dtype=f32)
    cache = torch.zeros(1, H, M + 1, W // H, dtype=f32)

    def fn():
        F.layer_norm(x, (W,))
        F.layer_norm(y, (W,))
        x + y
        x + y
        apply_rotary(q, cos, sin)
        apply_rotary(q, cos, sin)
        with torch.no_grad():
            gelu_tanh_(h)  # the engine's GELU (compiled, in place, for large fp32 activations)
        cache[:, :, :M] = q  # keys
        cache[:, :, :M] = q  # values
        o = out.to(dtype) if dtype != f32 else out
        if merge_copy:
            o.transpose(1, 2).reshape(M, W)  # (1, M, H, D) -> (M, W): a copy
        if dtype != f32:
            q.to(f32)
    return fn


def elementwise_elements(M: int, W: int, narrow: bool = False) -> int:
    """Elements the mix passes, counted as analytic.forward_elementwise counts them (norms 2MW, adds 2MW, rotary
    5 * M * 2W for q and k, GELU M * 4W), plus the copies: cache writes 2MW, the output's copy MW, and with
    ``narrow`` weights (bf16, int8) the two conversions 2MW."""
    return 2 * M * W + 2 * M * W + 5 * M * 2 * W + M * 4 * W + 3 * M * W + (2 * M * W if narrow else 0)


def elementwise_table(dtypes: tuple[str, ...]) -> dict:
    """{dtype: {"rows": [[M, W, elements, s]], "floor": s}}."""
    from attnlab.engine.quantize import DTYPES

    out = {}
    for dtype in dtypes:
        act = DTYPES[dtype]
        fw = CALIBRATION["floor_width"]
        rows = []
        for W in CALIBRATION["widths"]:
            for M in CALIBRATION["elementwise_rows"]:
                if M * 4 * W > ELEMENT_CAP:
                    continue
                rows.append([M, W, elementwise_elements(M, W, dtype != "fp32"),
                             timed(_elementwise_mix(M, W, act), repeats=5, inner=5 if M * W < 2 ** 16 else 1)])
        out[dtype] = {"rows": rows, "floor": timed(_elementwise_mix(1, fw, act), repeats=7, inner=20)}
    return out


def cold_dispatch(trials: int = 25) -> dict:
    """{"rows": [[bytes, s]]}: seconds of the elementwise floor's 15 tiny kernels (all dispatch, no arithmetic)
    just after ``bytes`` were streamed through the caches (a sum). Why: in a decode step every small op follows a
    matrix that was streamed from memory and evicted what dispatching needs, and the same calls can take several
    times longer then than after nothing. Each figure is the median of ``trials``, timed around the
    kernels only."""
    mix = _elementwise_mix(1, CALIBRATION["floor_width"], torch.float32)
    rows = []
    for mib in CALIBRATION["cold_mib"]:
        buf = torch.ones(max(1, int(mib * MiB) // 4))
        mix()
        wall, cpu = [], []
        for _ in range(trials):
            buf.sum()
            w, c = time.perf_counter(), time.process_time()
            mix()
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
        rows.append([int(mib * MiB), {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}])
    return {"rows": rows}


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


def composition(dtypes: tuple[str, ...], micro_so_far: dict, measured: dict | None = None) -> dict:
    """{"rows": [[dim, heads, layers, dtype, measured, predicted]]}: CALIBRATION's composition models run by the
    engine in fresh processes, as a validation case is (measured: {clock: {"ttft", "decode"}} seconds, the fastest
    of ``processes`` runs), beside what ``cost.cpu`` predicts for them from the other tables (``micro_so_far``) as
    the sum of their parts (predicted: {clock: {"prefill", "decode"}}). Why: the parts are timed one kernel at a
    time, each on its own inputs, warm; in the engine each kernel follows another that has just used the caches and
    the core, and the sum came out low on almost every validated case (bf16 prefill by 25-40%), more so the
    narrower the model. cost.cpu scales its sum by the measured ratio (cpu.composition).

    ``measured``: an earlier calibration's composition in the same process, whose whole-model timings are kept
    (not run again) and predicted afresh from these tables. Why afresh: the tables of one calibration differ from
    the next by more than the machine's pace (one run's decode sums for the same model: 19.2, 15.8 and 15.9 ms
    from its three calibrations), so a ratio carries only to the tables it was taken against."""
    from attnlab.cost import cpu
    from attnlab.cost.arch import from_model_config
    from attnlab.measure.engine_timing import op_counts

    c = CALIBRATION.get("composition")
    B, T, new = (c["batch"], c["prompt"], c["new_tokens"]) if c else (0, 0, 0)
    timed_models = (dict(((r[0], r[1], r[2], r[3]), r[4]) for r in measured["rows"]) if measured is not None
                    else _time_composition_models(dtypes))
    rows = []
    for (dim, heads, layers, dtype), t in timed_models.items():
        cfg = _composition_config(dim, heads, layers)
        a = from_model_config(cfg)
        ops = op_counts(cfg, B, T, T + new // 2, dtype)
        predicted = {clock: {
            "prefill": cpu.prefill_s(a, B, T, micro_so_far, dtype, ops, clock, composed=False)["total"],
            "decode": cpu.decode_s(a, B, T + new // 2, micro_so_far, dtype, ops, clock, composed=False)["total"]}
            for clock in ("wall", "cpu")}
        rows.append([dim, heads, layers, dtype, t, predicted])
    return {"rows": rows}


def _composition_config(dim: int, heads: int, layers: int):
    """A composition model's config: room for its prompt and the tokens it generates."""
    from attnlab.config import ModelConfig

    c = CALIBRATION["composition"]
    return ModelConfig(dim=dim, n_layers=layers, n_heads=heads, vocab_size=256,
                       max_seq_len=c["prompt"] + c["new_tokens"] + 8)


def _time_composition_models(dtypes: tuple[str, ...]) -> dict:
    """(dim, heads, layers, dtype) -> {clock: {"ttft", "decode"}}: each composition model timed in ``processes``
    fresh processes, round by round, each figure the fastest process's."""
    from dataclasses import asdict

    from attnlab.timing import run_fresh

    c = CALIBRATION.get("composition")
    if not c:
        return {}
    B, T, new = c["batch"], c["prompt"], c["new_tokens"]
    combos = [(dim, heads, layers, dtype) for dim, heads, layers in c["models"] for dtype in dtypes]
    # Round by round, every (model, dtype) once a round: one model's processes lie a whole round apart, so a slow
    # spell of the machine (tens of seconds) slows one of them, not all, and not one dtype's alone.
    runs: dict = {combo: [] for combo in combos}
    for _ in range(c["processes"]):
        for dim, heads, layers, dtype in combos:
            micro.check_cancel()
            cfg = _composition_config(dim, heads, layers)
            runs[(dim, heads, layers, dtype)].append(run_fresh(
                "attnlab.measure.engine_timing", "time_model_json", [asdict(cfg), dtype, B, T, new, c["repeats"]],
                env={}, what=f"timing the {dim}-wide composition model in {dtype}"))
    # the fastest process's figures: now and then one runs slower throughout (its layouts, chosen by measurement as
    # it started, or a neighbour), which would scale every prediction of its calibration
    return {combo: {clock: {k: min(r[clock][k] for r in got) for k in ("ttft", "decode")} for clock in ("wall", "cpu")}
            for combo, got in runs.items()}


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

"""Predicted engine times on a CPU, from the micro-benchmarks of ``attnlab.measure.calibrate`` (a ``local`` spec's ``micro``).

A forward is the sum of what its parts cost when run one after another (a CPU runs them in sequence, each
limited by its own bottleneck):

    prefill = engine call + rows * per-row + ops * per-op + dtype's extra (probe: dispatch and Python)
              + L * 2 * M * P_layer / FLOP/s(M, d)                         (linear_prefill, M = B * T rows)
              + L * B * H * 4 * D * T(T+1)/2 / FLOP/s(T, D)                (attention: causal)
              + L * elements(M, d) * s/element(M, d)                       (elementwise)
              + head(B rows) + sampler(B x V logits)                              (head, sampling)
              + KV-cache bytes / first-touch bytes/s                             (memory)
    decode  = engine step + rows * per-row + (small ops * cold(bytes one layer reads) + matmuls) * per-op
              + dtype's extra                                               (cold_dispatch)
              + layers' weight bytes / bytes/s(d, working set, B)           (linear_decode: every weight, once)
              + head(B rows) + sampler(B x V logits)                        (head, sampling)
              + L * B * Hkv * S * D * 2 * cache bytes / bytes/s(S, D)       (attention: one query)
              + L * elements(B, d) * s/element(B, d)

and each phase's sum is then scaled by its ``composition``: how much longer the engine took than the same sum on
whole models the calibration ran (measured / predicted, by dtype, interpolated in log depth and log width). The
parts are timed one kernel at a time on warm inputs; in the engine each follows another that has just used the
caches and the core, which the sum misses.

head = the larger of its bytes / bytes/s(d, working set, B) and its weights * s/weight(d, B) read hot (a large
vocabulary's head on a few rows can be bound by arithmetic, as bf16 without AMX is); sampler = B * V * s/logit(B).
Each rate is interpolated (log-log, clamped at the ends) in the table measured at other shapes; each table's
figure is taken above the cost of calling the same kernel at a tiny shape (its floor), which the per-op term
carries (the probe runs fp32: "dtype's extra" is what another dtype's floors cost beyond fp32's). ``clock`` picks
the wall-time or the CPU-time figures of the same calibration.
"""
from __future__ import annotations

import math

from attnlab.cost.analytic import dtype_bytes, forward_elementwise, params
from attnlab.cost.arch import Arch

SAMPLE_FLOOR_LOGITS = 32  # the calibration times the sampler over this many logits per row: its dispatch alone


def _interp(points: list[tuple[float, float]], x: float, log_y: bool = True) -> float:
    """Piecewise-linear interpolation in log x (and log y), clamped to the end values outside the points."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    if x >= pts[-1][0]:
        return pts[-1][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            if log_y and y0 > 0 and y1 > 0:
                return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
            return y0 + w * (y1 - y0)
    return pts[-1][1]


def _interp2(table: list[tuple[float, float, float]], x: float, y: float, log_v: bool = True) -> float:
    """Interpolate (x, y) -> v: along y within each measured x, then along x."""
    by_x: dict = {}
    for tx, ty, v in table:
        by_x.setdefault(tx, []).append((ty, v))
    return _interp([(tx, _interp(pts, y, log_v)) for tx, pts in by_x.items()], x, log_v)


def overheads(micro: dict, clock: str) -> dict:
    """Per-op, per-call and per-row costs from the probe (1 and 16 layers, 1 and 6 sequences, traced op counts):
    per-op = slope of time over ops between the two depths; fixed = the 1-layer time less its ops."""
    rows = micro["probe"]["rows"]
    single = sorted((r for r in rows if r[1] == 1), key=lambda r: r[0])
    lo, hi = single[0], single[-1]
    out = {}
    for phase, key in (("prefill", "ttft"), ("decode", "decode")):
        t_lo, t_hi = lo[2][clock][key], hi[2][clock][key]
        per_op = max((t_hi - t_lo) / (hi[3][phase] - lo[3][phase]), 0.0)
        fixed = max(t_lo - per_op * lo[3][phase], 0.0)
        batched = [r for r in rows if r[1] > 1 and r[0] == lo[0]]
        per_row = max((batched[0][2][clock][key] - t_lo) / (batched[0][1] - 1), 0.0) if batched else 0.0
        out[phase] = {"per_op_s": per_op, "fixed_s": fixed, "per_row_s": per_row}
    return out


def cold_factor(micro: dict, clock: str, streamed_bytes: float) -> float:
    """How much dearer a small op is when ``streamed_bytes`` went through the caches just before it than when
    nothing did (calibrate.cold_dispatch; 1 where the calibration lacks the table). Interpolated in log bytes."""
    rows = micro.get("cold_dispatch", {}).get("rows")
    if not rows:
        return 1.0
    hot = rows[0][1][clock]
    return max(1.0, _interp([(max(b, 1), t[clock] / hot) for b, t in rows], max(streamed_bytes, 1), log_y=False))


def _floor(entry: dict, clock: str) -> float:
    return entry[clock]


def _dtype_extra_s(micro: dict, dtype: str, clock: str, matmuls: int, layers: int) -> float:
    """What calling this dtype's kernels costs beyond fp32's (the probe runs fp32): the floors' differences."""
    if dtype == "fp32":
        return 0.0
    lin = micro["linear"]
    ew = micro["elementwise"]
    extra = (_floor(lin[dtype]["floor"], clock) - _floor(lin["fp32"]["floor"], clock)) / 4 * matmuls
    extra += (_floor(ew[dtype]["floor"], clock) - _floor(ew["fp32"]["floor"], clock)) * layers
    return extra


def _linear_prefill_flops(micro: dict, dtype: str, clock: str, M: int, W: int) -> float:
    t = micro["linear"][dtype]
    floor = _floor(t["floor"], clock)
    table = [(w, m, 24 * m * w * w / max(s[clock] - floor, 1e-9)) for w, m, s in t["prefill"]]
    return _interp2(table, W, M)


def _linear_decode_bw(micro: dict, dtype: str, clock: str, W: int, working_set: float, rows: int) -> float:
    t = micro["linear"][dtype]
    floor = _floor(t["floor"], clock)
    nbytes = dtype_bytes(dtype)
    by_rows: dict = {}
    for w, r, ws, s in t["decode"]:
        by_rows.setdefault(r, []).append((w, ws, 12 * w * w * nbytes / max(s[clock] - floor, 1e-9)))
    return _by_rows([(r, _interp2(tab, W, working_set)) for r, tab in by_rows.items()], rows)


def _by_rows(pts: list[tuple[float, float]], rows: int) -> float:
    """Linear in rows between the measured row counts, clamped at the ends."""
    pts = sorted(pts)
    if rows <= pts[0][0]:
        return pts[0][1]
    for (r0, v0), (r1, v1) in zip(pts, pts[1:]):
        if rows <= r1:
            return v0 + (rows - r0) / (r1 - r0) * (v1 - v0)
    return pts[-1][1]


def _head_s(micro: dict, dtype: str, clock: str, a: Arch, rows: int, working_set: float) -> float:
    """The LM head on ``rows`` rows: the larger of streaming its weights and its hot time, per weight, at the
    calibration's vocabulary (calibrate.head_table). Its streaming rate is the layer table's at the width whose
    largest matrix (4W x W) holds as many weights as the head: a call's streaming rate depends on its matrix's size
    (fixed costs per call and per row weigh less on a large matrix), and the head is one large matrix."""
    weights = a.vocab_size * a.dim
    like = math.sqrt(weights / 4)
    stream = weights * dtype_bytes(dtype) / _linear_decode_bw(micro, dtype, clock, like, working_set, rows)
    t = micro["head"][dtype]
    floor = _floor(micro["linear"][dtype]["floor"], clock) / 4  # one matrix's call of the layer set's four
    V = micro["shapes"]["head_vocab"]
    by_rows: dict = {}
    for w, r, s in t["head"]:
        by_rows.setdefault(r, []).append((w, max(s[clock] - floor, 1e-12) / (w * V)))
    hot = _by_rows([(r, _interp(pts, a.dim)) for r, pts in by_rows.items()], rows)
    return max(stream, weights * hot)


def _sampling_s(micro: dict, dtype: str, clock: str, a: Arch, rows: int) -> float:
    """The greedy sampler over ``rows`` x V logits, beyond its dispatch (which the probe's per-op cost carries)."""
    t = micro["head"][dtype]
    V = micro["shapes"]["head_vocab"]
    floors = dict((r, s[clock]) for r, s in t["sample_floor"])
    per_logit = [(r, max(s[clock] - floors[r], 0.0) / (r * (V - SAMPLE_FLOOR_LOGITS))) for r, s in t["sample"]]
    return rows * a.vocab_size * _by_rows(per_logit, rows)


def _attention_prefill_flops(micro: dict, clock: str, T: int, D: int, dtype: str) -> float:
    a = micro["attention"]
    H = micro["shapes"]["attention_heads"]
    kind = attention_dtype(dtype, micro)
    floor = _floor(a["floor"]["prefill"][kind], clock)
    table = [(d, t, H * 4 * d * t * (t + 1) / 2 / max(s[clock] - floor, 1e-9)) for t, d, s in a["prefill"][kind]]
    return _interp2(table, D, T)


def _attention_decode_bw(micro: dict, clock: str, S: int, D: int, working_set: float) -> float:
    """Bytes/s of keys and values read by a one-query call, at S keys of head_dim D, when a step's reads add up to
    ``working_set`` bytes (interpolated between the table's single cache and its caches cycled from DRAM)."""
    a = micro["attention"]
    H = micro["shapes"]["attention_heads"]
    floor = _floor(a["floor"]["decode"], clock)
    by_ws: dict = {}
    for s, d, ws, sec in a["decode"]:
        by_ws.setdefault("hot" if ws == 2 * H * s * d * 4 else "cold", []).append(
            (d, s, ws, H * s * d * 8 / max(sec[clock] - floor, 1e-9)))
    pts = []
    for rows in by_ws.values():
        bw = _interp2([(d, s, b) for d, s, _, b in rows], D, S)
        ws = math.exp(_interp2([(d, s, math.log(w)) for d, s, w, _ in rows], D, S, log_v=False))
        pts.append((ws, bw))
    return _interp(pts, working_set)


def _elementwise_s_per_element(micro: dict, dtype: str, clock: str, M: int, W: int) -> float:
    e = micro["elementwise"][dtype]
    floor = _floor(e["floor"], clock)
    table = [(w, m, max(s[clock] - floor, 0.0) / n) for m, w, n, s in e["rows"]]
    return _interp2(table, W, M, log_v=False)


def _layer_elements(a: Arch, T: int, S: int, batch: int, dtype: str) -> float:
    """Elementwise passes of one layer, as the calibration's mix counts them (calibrate.elementwise_elements):
    analytic.forward_elementwise's norms, adds, rotary and activation (not the softmax: SDPA holds it), plus the
    copies: keys and values into the cache, the attention output back to rows, and for weights narrower than fp32
    the queries widened to the cache's fp32 and the output narrowed back."""
    e = forward_elementwise(a, T, S, batch)
    base = (e["total"] - e.get("softmax", 0) - e["sampling"] - batch * T * a.dim) / a.n_layers  # less final norm
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    copies = batch * T * (2 * kv + q + (2 * q if dtype != "fp32" else 0))
    return base + copies


def _matrix_params(a: Arch) -> tuple[int, int]:
    """(weights of one layer's matrices, weights of the LM head)."""
    p = params(a)
    per_layer = p["layer_attention"] + p["layer_mlp"]
    return per_layer, a.vocab_size * a.dim


def part_kinds(phase: str, dtype: str, micro: dict) -> dict:
    """Which pace (engine_timing.Pulse) each part of a phase keeps: matrix arithmetic in its dtype (attention in the
    cache's, elementwise kernels on fp32 vector units), streaming from memory, or dispatch."""
    if phase == "prefill":
        return {"overhead": "dispatch", "linear": dtype if dtype in ("fp32", "bf16") else "fp32",
                "attention": attention_dtype(dtype, micro), "elementwise": "fp32", "head": "memory", "sampling": "fp32", "kv_cache": "memory"}
    return {"overhead": "dispatch", "linear": "memory", "attention": "memory", "elementwise": "fp32",
            "head": "memory", "sampling": "fp32"}


def pace(calibration_pulse: dict, now_pulse: dict, clock: str) -> dict:
    """{kind: now / calibration} of the pulse's medians: > 1 where the machine ran slower now."""
    return {k: now_pulse[clock][k] / calibration_pulse[clock][k] for k in now_pulse[clock]}


def at_pace(parts: dict, phase: str, dtype: str, micro: dict, now_pulse: dict, clock: str) -> dict:
    """``parts`` (predicted at the pace of the calibration ``micro``) each scaled by how much slower (> 1) or faster
    its kind ran now: the ratio of the pulse's medians now and during the calibration (engine_timing.Pulse.medians)."""
    kinds, calibration_pulse = part_kinds(phase, dtype, micro), micro["pulse"]
    out = {k: v * now_pulse[clock][kinds[k]] / calibration_pulse[clock][kinds[k]]
           for k, v in parts.items() if k != "total"}
    out["total"] = sum(out.values())
    return out


def composition(micro: dict, dtype: str, clock: str, phase: str, dim: int, layers: int) -> float:
    """How much longer the engine took than the sum of its parts on the calibration's whole models in this dtype
    (calibrate.composition: measured / predicted): interpolated in log depth among the models of each width, then in
    log width, clamped at the ends; 1 where the calibration has none."""
    key = "ttft" if phase == "prefill" else "decode"
    by_width: dict = {}
    for r in micro.get("composition", {}).get("rows", []):
        if r[3] == dtype and r[5][clock][phase] > 0:
            by_width.setdefault(r[0], []).append((r[2], r[4][clock][key] / r[5][clock][phase]))
    return _interp([(w, _interp(pts, layers)) for w, pts in by_width.items()], dim) if by_width else 1.0


def _composed(parts: dict, micro: dict, dtype: str, clock: str, phase: str, a: Arch, composed: bool) -> dict:
    f = composition(micro, dtype, clock, phase, a.dim, a.n_layers) if composed else 1.0
    parts = {k: v * f for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def prefill_s(a: Arch, batch: int, T: int, micro: dict, dtype: str, ops: dict, clock: str = "wall",
              composed: bool = True) -> dict:
    """Predicted seconds of the engine's prefill (time to first token) of ``batch`` prompts of T tokens, by part.
    ``ops``: the tracer's counts (engine_timing.op_counts). ``composed``: each part scaled by ``composition``
    (False: the plain sum of the parts, which the calibration compares with the engine)."""
    o = overheads(micro, clock)["prefill"]
    M, L, D = batch * T, a.n_layers, a.head_dim
    layer_w, head_w = _matrix_params(a)
    nbytes = dtype_bytes(dtype)
    weights = (L * layer_w + head_w) * nbytes
    kv_touch = 2 * L * batch * a.n_kv_heads * (T + 1) * D * cache_bytes(dtype, micro)  # the fresh cache (set_precision)
    mem = micro["memory"]
    touch_bw = mem["touch_bytes"] / mem["touch"][clock]
    parts = {
        "overhead": o["fixed_s"] + o["per_row_s"] * (batch - 1) + o["per_op_s"] * ops["prefill"]
        + _dtype_extra_s(micro, dtype, clock, ops["prefill_matmuls"], L),
        "linear": L * 2 * M * layer_w / _linear_prefill_flops(micro, dtype, clock, M, a.dim),
        "attention": L * batch * a.n_heads * 4 * D * T * (T + 1) / 2
        / _attention_prefill_flops(micro, clock, T, D, dtype),
        "elementwise": L * _layer_elements(a, T, 0, batch, dtype)
        * _elementwise_s_per_element(micro, dtype, clock, M, a.dim),
        "head": _head_s(micro, dtype, clock, a, batch, weights),
        "sampling": _sampling_s(micro, dtype, clock, a, batch),
        "kv_cache": kv_touch / touch_bw,
    }
    return _composed(parts, micro, dtype, clock, "prefill", a, composed)


def cache_bytes(dtype: str, micro: dict) -> int:
    """Bytes of one cached key element as set_precision keeps the cache on a CPU for the sdpa kernel without ALiBi
    (every validation case; the model predicts nothing else on a CPU): bf16 for bf16 and int8 weights where
    attnlab's decode attention reads it (its compiled kernels were there when ``micro`` was measured), else fp32."""
    return 2 if dtype in ("bf16", "int8") and micro["compiled_kernels"] else 4


def attention_dtype(dtype: str, micro: dict) -> str:
    """The dtype a prefill attends in: the cache's (cache_bytes), which the queries are converted to."""
    return "bf16" if cache_bytes(dtype, micro) == 2 else "fp32"


def decode_s(a: Arch, batch: int, S: int, micro: dict, dtype: str, ops: dict, clock: str = "wall",
             composed: bool = True) -> dict:
    """Predicted seconds of one decode step of ``batch`` sequences with S tokens cached, by part (``composed``: as
    prefill_s's)."""
    o = overheads(micro, clock)["decode"]
    L, D = a.n_layers, a.head_dim
    layer_w, head_w = _matrix_params(a)
    weights = (L * layer_w + head_w) * dtype_bytes(dtype)
    kv = L * batch * a.n_kv_heads * (S + 1) * D * 2 * cache_bytes(dtype, micro)  # keys and values read
    step_bytes = weights + kv  # what one step reads: it decides whether the reads come from cache or from DRAM
    # Each small op runs once per layer: between two runs of the same op (its code, its module's objects) one
    # layer's weights and cache went through the caches, so it dispatches as cold as that (cold_factor). The matmul
    # calls' own dispatch is inside the streaming table's figures already.
    cold = cold_factor(micro, clock, step_bytes / L)
    small_ops = ops["decode"] - ops["decode_matmuls"]
    parts = {
        "overhead": o["fixed_s"] + o["per_row_s"] * (batch - 1)
        + o["per_op_s"] * (small_ops * cold + ops["decode_matmuls"])
        + _dtype_extra_s(micro, dtype, clock, ops["decode_matmuls"], L),
        "linear": L * layer_w * dtype_bytes(dtype) / _linear_decode_bw(micro, dtype, clock, a.dim, step_bytes, batch),
        "head": _head_s(micro, dtype, clock, a, batch, step_bytes),
        "sampling": _sampling_s(micro, dtype, clock, a, batch),
        "attention": kv / _attention_decode_bw(micro, clock, S + 1, D, step_bytes),
        "elementwise": L * _layer_elements(a, 1, S, batch, dtype)
        * _elementwise_s_per_element(micro, dtype, clock, batch, a.dim),
    }
    return _composed(parts, micro, dtype, clock, "decode", a, composed)

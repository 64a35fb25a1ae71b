"""The calibration's elementwise tables (calibrate.py runs them): one layer's non-matmul kernels on M rows, and
their dispatch cost just after a large read has evicted what dispatching needs."""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from attnlab.measure.micro import CALIBRATION, MiB, floor_timed, timed

ELEMENT_CAP = 2 * 2 ** 20


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
            gelu_tanh_(h)  # the engine's GELU (compiled, in place, for large fp32 or bf16 activations)
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
        out[dtype] = {"rows": rows, "floor": floor_timed(_elementwise_mix(1, fw, act))}
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

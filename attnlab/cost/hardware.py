"""Hardware specs for the roofline: peak FLOP/s per dtype, memory bandwidth, memory size, op overhead.

Datasheet figures are dense (no structured sparsity). ``local`` is measured on the spot by a short
micro-benchmark (matmul FLOP/s in fp32 and bf16, the bandwidth of a large sum, and the fixed cost of
dispatching one small op) and cached in ~/.cache/attnlab/, keyed by CPU, thread count and torch version.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from attnlab.errors import ConfigError


@dataclass
class Hardware:
    name: str
    peak_flops: dict  # dtype -> FLOP/s
    bandwidth_bytes_per_s: float
    memory_bytes: float
    op_overhead_s: float = 5e-6  # per dispatched kernel: launch latency on a GPU, dispatch cost on a CPU
    source: str = "datasheet"
    # Measured specs only: achieved fp32 FLOP/s of a (256 x d) @ (d x 4d) matmul by width d (narrow layers
    # run far below peak),
    # and the bandwidth a matrix-vector product achieves when streaming weights (what decode does).
    flops_by_size: dict | None = None
    gemv_bytes_per_s: float | None = None
    # Measured specs only: elements per second through non-matmul kernels (norms, softmax, GELU, rotary, adds)
    # on activations that stay in cache, as one transformer layer runs them.
    elementwise_per_s: float | None = None
    # Measured specs only: the last-level cache's size and the matrix-vector bandwidth when the weights fit in
    # it (a small model's decode reads its weights from cache, not from DRAM).
    cache_bytes: int | None = None
    cached_gemv_bytes_per_s: float | None = None
    gemv_by_width: dict | None = None  # measured specs: streaming bytes/s of one layer's matrices by width d

    def flops(self, dtype: str, size: float | None = None) -> float:
        peak = self.peak_flops.get(dtype) or self.peak_flops["fp32"]
        if size is None or not self.flops_by_size:
            return peak
        pts = _monotone(self.flops_by_size)
        return _interpolate(pts, size) * peak / pts[-1][1]  # the table is fp32: carry its shape to other dtypes

    def stream_bandwidth(self, nbytes: float | None = None, width: float | None = None) -> float:
        """Bytes/s when weights stream through matrix-vector products (measured, for layers of ``width``),
        else the datasheet figure. A working set of ``nbytes`` within half the last-level cache is read at the
        cached rate (measured)."""
        if nbytes is not None and self.cached_gemv_bytes_per_s and self.cache_bytes and nbytes <= self.cache_bytes / 2:
            return self.cached_gemv_bytes_per_s
        if width is not None and self.gemv_by_width:
            return _interpolate(_monotone(self.gemv_by_width), width)
        return self.gemv_bytes_per_s or self.bandwidth_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)


def _monotone(table: dict) -> list[tuple[int, float]]:
    """(size, value) points sorted by size, each the best so far: a wider layer is never less efficient, which
    smooths the noise of single measurements."""
    pts, best = [], 0.0
    for n, f in sorted((int(n), f) for n, f in table.items()):
        best = max(best, f)
        pts.append((n, best))
    return pts


def _interpolate(pts: list[tuple[int, float]], size: float) -> float:
    """Log-linear interpolation between measured sizes; the end values beyond them."""
    if size <= pts[0][0]:
        return pts[0][1]
    for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
        if size <= n1:
            w = (math.log(size) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return math.exp(math.log(f0) + w * (math.log(f1) - math.log(f0)))
    return pts[-1][1]


GB = 1e9
SPECS = {
    "h100-sxm": Hardware("h100-sxm", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, 3.35e12, 80 * GB),
    "h200": Hardware("h200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}, 4.8e12, 141 * GB),
    "a100-80gb": Hardware("a100-80gb", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}, 2.039e12, 80 * GB),
    "rtx-4090": Hardware("rtx-4090", {"bf16": 165e12, "fp16": 165e12, "fp32": 82.6e12}, 1.008e12, 24 * GB),
}
ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "4090": "rtx-4090"}
NAMES = tuple(SPECS) + ("local",)


def _cache_path() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab")) / "hardware-local.json"


def calibrate(seconds_budget: float = 3.0) -> Hardware:
    """Measure this machine now: best-of matmul FLOP/s (fp32, bf16), sum bandwidth, per-op overhead."""
    import torch

    from attnlab.runtime import cpu_name

    def best_matmul(dtype, n=1024, reps=5, min_s=0.25, rows=None):
        """Best of at least `reps` runs and `min_s` seconds of (rows x n) @ (n x 4n) (square n x n when rows
        is None): a layer's MLP shape, whose efficiency at small n is far below the big-matmul peak."""
        m, k, cols = (n, n, n) if rows is None else (rows, n, 4 * n)
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, cols, dtype=dtype)
        a @ b
        best, runs, start = 0.0, 0, time.perf_counter()
        while runs < reps or time.perf_counter() - start < min_s:
            t = time.perf_counter()
            a @ b
            best = max(best, 2 * m * k * cols / (time.perf_counter() - t))
            runs += 1
        return best

    x = torch.ones(64 * 2**20)  # 256 MiB: far beyond the caches
    x.sum()
    bw = 0.0
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        bw = max(bw, x.numel() * 4 / (time.perf_counter() - t))
    overhead = _dispatch_overhead_s()
    # Weight streaming as decode does it: a row vector times distinct fp32 matrices, cycled, through the
    # engine's own inference Linear (DenseLinear: oneDNN-prepacked on CPU), for one layer's shapes at width d
    # (4d x d, d x 4d, 3d x d, d x d) repeated past 96 MiB, so that none stays in cache. Narrow matrices stream
    # slower (measured here: ~16 GB/s at d = 384, ~24 at 768-1024, ~29 at 2048), so like the matmul table this
    # one is by width. Three square matrices filling a third of the last-level cache stay in it, as a small
    # model's weights do from one token to the next.
    cache = _last_level_cache_bytes()
    gemv_by_width = {d: _gemv_bytes_per_s([(4 * d, d), (d, 4 * d), (3 * d, d), (d, d)] * max(1, round(96 * 2**20 / (36 * d * d))),
                                          overhead) for d in (256, 512, 1024, 2048)}
    gemv = gemv_by_width[1024]
    cached_gemv = None
    if cache and cache >= 3 * 2**20:
        n = max(256, int(math.sqrt(cache / 3 / 3 / 4)) // 64 * 64)
        cached_gemv = _gemv_bytes_per_s([(n, n)] * 3, overhead, reps=20)
    by_size = {n: best_matmul(torch.float32, n, rows=256) for n in (64, 128, 256, 512, 1024)}
    elementwise = _elementwise_rate(overhead)
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 16 * GB
    return Hardware("local", {"fp32": best_matmul(torch.float32), "bf16": best_matmul(torch.bfloat16)}, bw, mem,
                    overhead, flops_by_size=by_size, gemv_bytes_per_s=gemv, elementwise_per_s=elementwise,
                    cache_bytes=cache, cached_gemv_bytes_per_s=cached_gemv, gemv_by_width=gemv_by_width, source=f"measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()}, "
                                     f"{torch.get_num_threads()} threads, torch {torch.__version__}")


def _last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG"
                         else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def _gemv_bytes_per_s(shapes: list[tuple[int, int]], overhead_s: float, reps: int = 4) -> float:
    """Best-of bytes/s of a row vector times each (out, in) fp32 matrix in turn, through DenseLinear, with
    the per-call dispatch cost (priced separately) taken off."""
    import torch
    from torch import nn

    from attnlab.engine.quantize import DenseLinear

    with torch.inference_mode():
        mats = [DenseLinear(nn.Linear(i, o, bias=False), torch.float32) for o, i in shapes]
        vecs = {i: torch.ones(1, i) for _, i in shapes}
        for m in mats:
            m(vecs[m.in_features])
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            for m in mats:
                m(vecs[m.in_features])
            best = min(best, time.perf_counter() - t)
    nbytes = sum(o * i * 4 for o, i in shapes)
    return nbytes / max(best - len(shapes) * overhead_s, best * 0.25)


def _elementwise_rate(overhead_s: float, T: int = 256, d: int = 256, heads: int = 4, reps: int = 7) -> float:
    """Elements per second through the non-matmul kernels of one transformer layer (d=256, T=256 tokens, as
    attnlab runs them): two layer norms, two residual adds, rotary on q and k, the causal softmax's
    exponentials, tanh-GELU on the 4d hidden layer. Elements are counted as ``forward_elementwise`` counts
    them; the dispatch cost of each call (``overhead_s``, priced separately) is taken off. Best of ``reps``."""
    import torch
    import torch.nn.functional as F

    from attnlab.models.positional import apply_rotary

    x, y = torch.randn(T, d), torch.randn(T, d)
    h = torch.randn(T, 4 * d)
    q = torch.randn(1, heads, T, d // heads)
    cos, sin = torch.randn(T, d // heads), torch.randn(T, d // heads)
    scores = torch.randn(heads, T, (T + 1) // 2)  # a causal row averages (T + 1) / 2 keys

    def layer():
        F.layer_norm(x, (d,))
        F.layer_norm(y, (d,))
        x + y
        x + y
        apply_rotary(q, cos, sin)
        apply_rotary(q, cos, sin)
        torch.softmax(scores, -1)
        F.gelu(h, approximate="tanh")

    elements = 2 * T * d + 2 * T * d + 5 * T * 2 * d + heads * T * (T + 1) // 2 + T * 4 * d
    calls = 4 + 2 * 5 + 1 + 1  # a rotary is 5 kernels: negate a half, concatenate, two products, add
    with torch.inference_mode():
        layer()
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            layer()
            best = min(best, time.perf_counter() - t)
    return elements / max(best - calls * overhead_s, best * 0.25)


def _dispatch_overhead_s() -> float:
    """Fixed cost per dispatched op as attnlab's engine pays it: decode steps (model forward plus sampling)
    of a transformer so narrow (dim 8) that its arithmetic is negligible, timed, divided by the ops the
    tracer counts in one step."""
    import torch

    from attnlab.config import ModelConfig
    from attnlab.cost.trace import trace
    from attnlab.engine.generate import generate
    from attnlab.models import build_model

    model = build_model(ModelConfig(dim=8, n_layers=4, n_heads=2, vocab_size=16, max_seq_len=256)).eval()
    generate(model, [1] * 8, 20)  # warm-up
    tpot = min(generate(model, [1] * 8, 60).stats.tpot_s for _ in range(5))
    state = model.new_state(1, 16)
    with torch.inference_mode():
        model(torch.zeros(1, 8, dtype=torch.long), state)
        ops = trace(model, torch.zeros(1, 1, dtype=torch.long), state).ops + SAMPLING_OPS
    return tpot / ops


CALIBRATION_VERSION = 4  # 2: elementwise_per_s; 3: gemv through DenseLinear, cache-resident gemv; 4: by width
SAMPLING_OPS = 4  # greedy sampling per step: argmax, gather, logsumexp, sub (counted by the tracer)


def local(refresh: bool = False) -> Hardware:
    import torch

    from attnlab.runtime import cpu_name

    # CALIBRATION_VERSION: a cache written by an older calibration (fewer measured fields) is measured again
    key = f"{cpu_name()}|{torch.get_num_threads()}|{torch.__version__}|v{CALIBRATION_VERSION}"
    path = _cache_path()
    entries = {}  # one entry per (CPU, threads, torch, calibration): runs with different --threads keep theirs
    if path.exists():
        try:
            data = json.loads(path.read_text())
            entries = data.get("entries", {}) if isinstance(data, dict) else {}
            if not refresh and key in entries:
                return Hardware(**entries[key])
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError):
            entries = {}
    hw = calibrate()
    entries[key] = hw.to_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"entries": entries}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return hw


def get(name: str, refresh: bool = False) -> Hardware:
    name = ALIASES.get(name, name)
    if name == "local":
        return local(refresh)
    if name not in SPECS:
        raise ConfigError(f"unknown hardware {name!r}; choose one of: {', '.join(NAMES)} "
                          f"(aliases: {', '.join(ALIASES)})")
    return SPECS[name]

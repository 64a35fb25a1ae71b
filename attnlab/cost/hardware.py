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

    def flops(self, dtype: str, size: float | None = None) -> float:
        peak = self.peak_flops.get(dtype) or self.peak_flops["fp32"]
        if size is None or not self.flops_by_size:
            return peak
        pts, best = [], 0.0
        for n, f in sorted((int(n), f) for n, f in self.flops_by_size.items()):
            best = max(best, f)  # a wider matmul is never less efficient: smooth the noise of single runs
            pts.append((n, best))
        scale = peak / max(f for _, f in pts)  # the table is fp32: carry its shape to other dtypes
        if size <= pts[0][0]:
            return pts[0][1] * scale
        for (n0, f0), (n1, f1) in zip(pts, pts[1:]):
            if size <= n1:  # log-linear interpolation between measured sizes
                w = (math.log(size) - math.log(n0)) / (math.log(n1) - math.log(n0))
                return math.exp(math.log(f0) + w * (math.log(f1) - math.log(f0))) * scale
        return pts[-1][1] * scale

    def stream_bandwidth(self) -> float:
        """Bytes/s when weights stream through matrix-vector products (measured), else the datasheet figure."""
        return self.gemv_bytes_per_s or self.bandwidth_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)


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

    from attnlab.report_context import cpu_name

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
    # Weight streaming: a vector times 8 distinct 2048 x 4096 fp32 matrices (256 MiB), cycled so that none
    # stays in cache: the access pattern of decode.
    mats = [torch.randn(4096, 2048) for _ in range(8)]
    v = torch.ones(1, 2048)
    gemv = 0.0
    with torch.inference_mode():
        for _ in range(4):
            t = time.perf_counter()
            for m in mats:
                torch.nn.functional.linear(v, m)
            gemv = max(gemv, sum(m.numel() * 4 for m in mats) / (time.perf_counter() - t))
    by_size = {n: best_matmul(torch.float32, n, rows=256) for n in (64, 128, 256, 512, 1024)}
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 16 * GB
    return Hardware("local", {"fp32": best_matmul(torch.float32), "bf16": best_matmul(torch.bfloat16)}, bw, mem,
                    overhead, flops_by_size=by_size, gemv_bytes_per_s=gemv, source=f"measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()}, "
                                     f"{torch.get_num_threads()} threads, torch {torch.__version__}")


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
    tpot = min(generate(model, [1] * 8, 60).stats.tpot_s for _ in range(3))
    state = model.new_state(1, 16)
    with torch.inference_mode():
        model(torch.zeros(1, 8, dtype=torch.long), state)
        ops = trace(model, torch.zeros(1, 1, dtype=torch.long), state).ops + SAMPLING_OPS
    return tpot / ops


SAMPLING_OPS = 3  # greedy sampling per step: argmax, log_softmax, gather (counted by the tracer)


def local(refresh: bool = False) -> Hardware:
    import torch

    from attnlab.report_context import cpu_name

    key = f"{cpu_name()}|{torch.get_num_threads()}|{torch.__version__}"
    path = _cache_path()
    if not refresh and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return Hardware(**data["hardware"])
        except (json.JSONDecodeError, TypeError, KeyError):
            pass
    hw = calibrate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "hardware": hw.to_dict()}))
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

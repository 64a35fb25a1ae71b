"""Hardware specs for the roofline: peak FLOP/s per dtype, memory bandwidth, memory size, op overhead.

Datasheet figures are dense (no structured sparsity). ``local`` is measured on the spot by micro-benchmarks
(``cost.calibrate``: matmul throughput per dtype, weight streaming, attention, elementwise kernels, per-op
overhead, memory bandwidth, all at shapes no validated model uses) and cached in ~/.cache/attnlab/, keyed by
CPU, thread count, torch version and calibration version.
"""
from __future__ import annotations

import json
import math
import os
import threading
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
    # Measured specs: every micro-benchmark's figures (cost.calibrate.run), which cost.cpu turns into engine times
    micro: dict | None = None

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


@dataclass
class Interconnect:
    """A link between devices: bandwidth per direction per device, and the latency of one message (datasheet
    figures; NCCL reaches ~80-90% of the bandwidth on large messages, which the cost model does not discount)."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = "datasheet"

    def to_dict(self) -> dict:
        return asdict(self)


# NVLink 4 (H100/H200 SXM): 900 GB/s per GPU both ways = 450 GB/s each way; NVLink 3 (A100): 600 GB/s -> 300.
# PCIe 4.0 / 5.0 x16: 32 / 64 GB/s each way. InfiniBand NDR 400 Gb/s = 50 GB/s per GPU's NIC (HDR: 25).
# Latencies: a few microseconds for one NVLink hop through NCCL, ~10 us over PCIe, ~5 us for an IB RDMA write.
INTERCONNECTS = {
    "nvlink4": Interconnect("nvlink4", 450e9, 3e-6),
    "nvlink3": Interconnect("nvlink3", 300e9, 3e-6),
    "pcie4": Interconnect("pcie4", 32e9, 10e-6),
    "pcie5": Interconnect("pcie5", 64e9, 10e-6),
    "infiniband-ndr": Interconnect("infiniband-ndr", 50e9, 5e-6),
    "infiniband-hdr": Interconnect("infiniband-hdr", 25e9, 5e-6),
}
DEFAULT_LINK = {"h100-sxm": "nvlink4", "h200": "nvlink4", "a100-80gb": "nvlink3", "rtx-4090": "pcie4",
                "local": "pcie4"}


def interconnect(name: str | None, hardware: str) -> Interconnect:
    """A named link, or the one ``hardware`` usually comes with (NVLink within an SXM node)."""
    name = name or DEFAULT_LINK.get(hardware, "pcie4")
    if name not in INTERCONNECTS:
        raise ConfigError(f"unknown interconnect {name!r}; choose one of: {', '.join(INTERCONNECTS)}")
    return INTERCONNECTS[name]


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


def calibrate(dtypes: tuple[str, ...] | None = None, modules: dict | None = None,
              cancel: threading.Event | None = None) -> Hardware:
    """Measure this machine now with the micro-benchmarks of ``cost.calibrate`` (matmul throughput and weight
    streaming per dtype, attention, elementwise kernels, per-op overhead, memory bandwidth; each at shapes no
    validated model uses). ``dtypes``: fp32 and whichever of bf16 / int8 this CPU runs natively (runtime.fast_dtypes).
    The summary fields (peak FLOP/s, bandwidth, ...) are read off the same tables; ``micro`` keeps them whole.
    ``modules``: matrices kept between calibrations in one process (calibrate.linear_tables). ``cancel``: an Event
    that stops the measuring early (``calibrate.Cancelled`` is raised; see calibrate.run)."""
    import torch

    from attnlab.cost import calibrate as cal
    from attnlab.cost.cpu import overheads
    from attnlab.runtime import cpu_name, fast_dtypes

    dtypes = tuple(dtypes or (d for d in fast_dtypes("cpu") if d != "int8"))
    micro = cal.run(dtypes, modules, cancel)
    lin = micro["linear"]

    def above_floor(t, table):
        return max(t["wall"] - table["floor"]["wall"], 1e-9)

    peak = {d: max(24 * m * w * w / above_floor(t, lin[d]) for w, m, t in lin[d]["prefill"]) for d in dtypes}
    by_size = {}
    for w, m, t in lin["fp32"]["prefill"]:  # the most rows measured at each width
        by_size[str(w)] = (m, 24 * m * w * w / above_floor(t, lin["fp32"]))
    gemv = {}
    for w, rows, ws, t in lin["fp32"]["decode"]:
        if rows == 1:
            gemv.setdefault(w, []).append((ws, 12 * w * w * 4 / above_floor(t, lin["fp32"])))
    widest = max(gemv)
    ew = micro["elementwise"]["fp32"]
    big = max(ew["rows"], key=lambda r: r[2])
    mem = micro["memory"]
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = 16 * GB
    return Hardware(
        "local", peak, mem["read_bytes"] / mem["read"]["wall"], ram, overheads(micro, "wall")["decode"]["per_op_s"],
        source=f"measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()}, {torch.get_num_threads()} threads, "
               f"torch {torch.__version__}, micro-benchmarks v{CALIBRATION_VERSION} ({micro['seconds']:.0f} s)",
        flops_by_size={k: v for k, (_, v) in by_size.items()},
        gemv_bytes_per_s=max(gemv[widest])[1],
        elementwise_per_s=big[2] / max(big[3]["wall"] - ew["floor"]["wall"], 1e-9),
        cache_bytes=_last_level_cache_bytes(), cached_gemv_bytes_per_s=max(min(v)[1] for v in gemv.values()),
        gemv_by_width={str(w): max(v)[1] for w, v in gemv.items()}, micro=micro)


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


# 2: elementwise_per_s; 3: gemv through DenseLinear, cache-resident gemv; 4: by width; 5: micro-benchmarks only, at
# shapes disjoint from the validated models' (cost.calibrate), kept whole in ``micro``; 6: prefill products through
# engine/many_rows (oneDNN where it is faster); 7: the LM head and the greedy sampler (calibrate.head_table);
# 8: prefill attention per dtype
CALIBRATION_VERSION = 8


def _local_key() -> str:
    import torch

    from attnlab.runtime import cpu_name

    # CALIBRATION_VERSION: a cache written by an older calibration (other fields, other shapes) is measured again
    return f"{cpu_name()}|{torch.get_num_threads()}|{torch.__version__}|micro-v{CALIBRATION_VERSION}"


def _read_entries() -> dict:
    """The cache's entries: one per (CPU, threads, torch, calibration), so runs with different --threads keep theirs."""
    path = _cache_path()
    if path.exists():
        try:
            data = json.loads(path.read_text())
            return data.get("entries", {}) if isinstance(data, dict) else {}
        except (json.JSONDecodeError, AttributeError):
            pass
    return {}


def save_local(hw: Hardware) -> None:
    """Cache a measured spec as this machine's (for its thread count and torch)."""
    entries = _read_entries()
    entries[_local_key()] = hw.to_dict()
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"entries": entries}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time


def local(refresh: bool = False, dtypes: tuple[str, ...] | None = None,
          cancel: threading.Event | None = None) -> Hardware:
    """The measured spec of this machine: from the cache, or calibrated now (``refresh``: always now) for
    ``dtypes`` (default: fp32, and bf16 where native); ``cancel``: see ``calibrate``."""
    entry = None if refresh else _read_entries().get(_local_key())
    if entry is not None:
        try:
            return Hardware(**entry)
        except TypeError:
            pass  # an entry of other fields: measure again
    hw = calibrate(dtypes, cancel=cancel)
    save_local(hw)
    return hw


def get(name: str, refresh: bool = False) -> Hardware:
    name = ALIASES.get(name, name)
    if name == "local":
        return local(refresh)
    if name not in SPECS:
        raise ConfigError(f"unknown hardware {name!r}; choose one of: {', '.join(NAMES)} "
                          f"(aliases: {', '.join(ALIASES)})")
    return SPECS[name]

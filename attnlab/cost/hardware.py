"""Hardware specs for the roofline: peak FLOP/s per dtype, memory bandwidth, memory size, op overhead.

Datasheet figures are dense (no structured sparsity). A ``local`` spec is built by ``from_micro`` from the
micro-benchmarks ``attnlab.measure`` runs (matmul throughput per dtype, weight streaming, attention, elementwise
kernels, per-op overhead, memory bandwidth); this module only reads them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

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
    # Measured specs: every micro-benchmark's figures (measure.calibrate.run), which cost.cpu turns into engine times
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


def from_micro(micro: dict, *, ram_bytes: float, cache_bytes: int | None, source: str) -> Hardware:
    """A measured spec from the calibration's raw figures (``micro``: the micro-benchmarks of
    ``attnlab.measure.calibrate``): the summary fields (peak FLOP/s per dtype, matmul efficiency by width, weight
    streaming, elementwise throughput, memory bandwidth, per-op overhead) are read off the same tables, and
    ``micro`` is kept whole for ``cost.cpu``. Pure: the measuring is ``attnlab.measure.local``'s."""
    from attnlab.cost.cpu import overheads

    lin = micro["linear"]

    def above_floor(t, table):
        return max(t["wall"] - table["floor"]["wall"], 1e-9)

    peak = {d: max(24 * m * w * w / above_floor(t, lin[d]) for w, m, t in lin[d]["prefill"]) for d in micro["dtypes"]}
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
    return Hardware(
        "local", peak, mem["read_bytes"] / mem["read"]["wall"], ram_bytes, overheads(micro, "wall")["decode"]["per_op_s"],
        source=source, flops_by_size={k: v for k, (_, v) in by_size.items()},
        gemv_bytes_per_s=max(gemv[widest])[1],
        elementwise_per_s=big[2] / max(big[3]["wall"] - ew["floor"]["wall"], 1e-9),
        cache_bytes=cache_bytes, cached_gemv_bytes_per_s=max(min(v)[1] for v in gemv.values()),
        gemv_by_width={str(w): max(v)[1] for w, v in gemv.items()}, micro=micro)


def get(name: str) -> Hardware:
    """A datasheet spec by name or alias. ``local`` is measured, not looked up: ``attnlab.measure.local.spec``."""
    name = ALIASES.get(name, name)
    if name == "local":
        raise ConfigError("the local spec is measured on this machine: use attnlab.measure.local.spec('local')")
    if name not in SPECS:
        raise ConfigError(f"unknown hardware {name!r}; choose one of: {', '.join(NAMES)} "
                          f"(aliases: {', '.join(ALIASES)})")
    return SPECS[name]

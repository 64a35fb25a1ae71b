"""One clock for everything attnlab times, and the machine's own limits read on it.

- ``time_calls``: a function's wall time (and CPU time) over repeated calls after a warm-up, synchronised on a GPU;
  the median is the figure, the range and the middle half (``middle_half``) the spread a reader judges it by;
- ``matmul_peak``, ``host_speed``: what this machine's fp32 matmul reaches now; ``memory_bandwidth``: what a large
  read reaches now (a step that streams its weights once cannot beat weight bytes over this);
- ``PeakMemory``: the most memory held above a starting point (resident bytes on a CPU, the allocator's peak on a
  GPU), and ``map_large_allocations`` / ``MMAP_ENV``, which make resident bytes follow the live tensors;
- ``run_fresh``: a function in a fresh Python process (its own peak memory, its own allocator, no warm caches).

Why one module: a ratio means something only when both sides were timed the same way (../shared/MEASURING.md), and
the same matmul peak read three ways is three different peaks.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

import torch

from attnlab.runtime import synchronize


def now(device=None) -> float:
    """The clock: seconds (perf_counter), after the device has finished what it was given."""
    if device is not None:
        synchronize(device)
    return time.perf_counter()


def middle_half(samples) -> tuple[float, float]:
    """(lower, upper) quartile of ``samples``: the range of their middle half, the ``len // 4`` lowest and highest
    left out. Timings on a shared machine carry stray spikes (another tenant's turn); one spike widens the full
    range as far as it goes, but not the middle half of 7 samples."""
    s = sorted(samples)
    k = len(s) // 4
    return s[k], s[-1 - k]


def time_calls(fn: Callable, repeats: int = 5, warmup: int = 1, *, device="cpu", inner: int = 1,
               before: Callable | None = None) -> dict:
    """Wall seconds per call of ``fn()`` after ``warmup`` untimed calls: the median over ``repeats`` repeats of
    ``inner`` calls each (per call), their min and max, their middle half (``lo_s``, ``hi_s``) and the median CPU
    seconds of this process per call (``cpu_s``). ``before`` runs ahead of every repeat, untimed (a cancellation
    check)."""
    if before is not None:
        before()
    for _ in range(warmup):
        fn()
    synchronize(device)
    wall, cpu = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        c, t = time.process_time(), now()
        for _ in range(inner):
            fn()
        w = now(device)
        wall.append((w - t) / inner)
        cpu.append((time.process_time() - c) / inner)
    lo, hi = middle_half(wall)
    return {"median_s": statistics.median(wall), "min_s": min(wall), "max_s": max(wall), "lo_s": lo, "hi_s": hi,
            "cpu_s": statistics.median(cpu), "repeats": repeats}


def matmul_peak(device="cpu", n: int = 2048, seconds: float = 0.5, onednn: bool = False) -> float:
    """Best fp32 matmul FLOP/s of n x n by n x n products over ``seconds`` on ``device``, at the threads in force.
    ``onednn``: on a CPU, also oneDNN's product where torch has it, each given ``seconds``, and the better of the two
    (the engine's prefill takes the faster library: engine.many_rows)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    products = [lambda: a @ b]
    if onednn and torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available():
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best = 0.0
    for product in products:
        product()
        start = now(device)
        while now() - start < seconds:
            t = now()
            product()
            best = max(best, 2 * n ** 3 / (now(device) - t))
    return best


def host_speed(n: int = 1024, repeats: int = 9) -> dict:
    """This host's fp32 matmul speed now (GFLOP/s, median and best of ``repeats`` after a warm-up), at the threads
    in force. Shared virtual machines run the same product at speeds up to 2x apart on different days: a long run
    records this at its start and end, so its wall time can be read against the host's speed."""
    a = torch.randn(n, n)
    t = time_calls(lambda: a @ a, repeats, 1)
    flops = 2 * n ** 3
    return {"matmul_gflops": flops / t["median_s"] / 1e9, "matmul_gflops_best": flops / t["min_s"] / 1e9, "n": n,
            "threads": torch.get_num_threads()}


def paired_ratios(num: Callable[[], float], den: Callable[[], float], n: int) -> list[float]:
    """``n`` ratios num() / den() of two calls made back to back, the order alternating from pair to pair (``num``
    first in even pairs). Each callable times itself and returns its wall seconds, so that untimed work around it (a
    cache rolled back) stays out. A ratio of two paths read on one clock at the same moment: two medians taken apart
    would also measure how the machine's pace moved between them (a shared host's memory bandwidth has changed by 2x
    within seconds)."""
    ratios = []
    for i in range(n):
        if i % 2 == 0:
            a = num()
            b = den()
        else:
            b = den()
            a = num()
        ratios.append(a / b)
    return ratios


def timed_read(n_bytes: int, device="cpu") -> Callable[[], float]:
    """A call that reads ``n_bytes`` of fp32 memory once (a sum) and returns its wall seconds: the time a step that
    streams that many bytes cannot beat on this machine now. The buffer is allocated here, once."""
    x = torch.ones(max(1, n_bytes // 4), device=device)

    def read() -> float:
        t = now(device)
        x.sum()
        return now(device) - t

    read()  # the pages touched once, untimed
    return read


def timed_step(model, prompt: list[int], rows: int = 1) -> Callable[[], float]:
    """A call that times one forward of ``model`` over ``rows`` new tokens after ``prompt`` and rolls its cache back,
    returning the wall seconds: a decode step (one row) or a verify pass (several) at that context, repeatable. The
    prompt is prefilled and one step warmed here, untimed."""
    device = next(model.parameters()).device
    state = model.new_state(1, len(prompt) + rows + 1)
    ids = torch.tensor([prompt[-rows:]], device=device)
    with torch.inference_mode():
        model(torch.tensor([prompt], device=device), state)
        model(ids, state)  # warm-up
        state.rollback([len(prompt)])

    def once() -> float:
        with torch.inference_mode():
            t = now(device)
            model(ids, state)
            took = now(device) - t
            state.rollback([len(prompt)])
        return took

    return once


def memory_bandwidth(n_bytes: int = 512 * 2**20, repeats: int = 5, device="cpu") -> float:
    """Best-of read bandwidth (bytes/s) of a large fp32 sum on ``device``, at the threads in force: what a step that
    streams its weights once can reach (batch-1 decode: time per token >= weight bytes / this)."""
    x = torch.ones(n_bytes // 4, device=device)
    return n_bytes / time_calls(x.sum, repeats, 1, device=device)["min_s"]


# --- memory ---------------------------------------------------------------------------------------------------------
# With glibc's mmap threshold fixed, every allocation over 64 KiB is a mapping of its own, unmapped when freed, so
# resident bytes follow the live tensors rather than what malloc keeps for later. MMAP_ENV sets it for a child
# process from its start; map_large_allocations sets it in this one.
MMAP_FROM_BYTES = 1 << 16
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_FROM_BYTES)}
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def map_large_allocations() -> bool:
    """Serve every allocation of 64 KiB or more by mmap, returned to the OS when freed. glibc otherwise raises its
    mmap threshold as large blocks are freed, after which tensors come from the heap and its high-water mark depends
    on fragmentation: the resident peak then varies from run to run for the same tensors."""
    libc = _libc()
    return bool(libc and libc.mallopt(_M_MMAP_THRESHOLD, MMAP_FROM_BYTES))


def resident_bytes(key: str = "VmRSS") -> int | None:
    """The process's resident bytes now (VmRSS) or at their peak since the last reset (VmHWM); None without procfs."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def resident_memory_readable(device) -> bool:
    """Whether the process's resident memory holds ``device``'s tensors and can be read (a CPU, with procfs)."""
    return torch.device(device).type == "cpu" and resident_bytes() is not None


def settled_resident_bytes() -> int | None:
    """The process's resident bytes once freed heap pages have gone back to the OS (malloc_trim): what the live
    objects occupy, read the same way at every point of a growth curve."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    return resident_bytes("VmRSS")


class PeakMemory:
    """A peak-memory window: ``start()`` then ``peak_bytes()`` = the most held above the start, in between.

    CPU: freed heap pages go back to the OS (malloc_trim) and the kernel's resident high-water mark is reset to the
    resident bytes now (/proc/self/clear_refs 5, Linux >= 4.0), so the peak is the work's, not start-up's; without
    procfs, the lifetime maximum above the start. GPU: torch's max_memory_allocated above what is allocated now."""

    def __init__(self, device="cpu"):
        self.dev, self.base = torch.device(device), 0

    def start(self) -> "PeakMemory":
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            torch.cuda.reset_peak_memory_stats(self.dev)
            self.base = torch.cuda.memory_allocated(self.dev)
            return self
        libc = _libc()
        if libc is not None:
            libc.malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = resident_bytes("VmRSS") or 0
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return self

    def peak_bytes(self) -> int:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
            return torch.cuda.max_memory_allocated(self.dev) - self.base
        peak = resident_bytes("VmHWM")
        return (peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - self.base


# --- a fresh process ------------------------------------------------------------------------------------------------
def run_fresh(module: str, func: str, args: list, threads: int | None = None, env: dict | None = None,
              what: str | None = None):
    """``module.func(*args)`` in a fresh Python process (threads as given, default this process's; ``env`` added to
    the environment, default MMAP_ENV); returns its JSON result. ``args`` and the result are JSON. Raises
    RuntimeError naming ``what`` (default the function) and the child's last error line if it fails."""
    code = (f"import json, sys; from attnlab.runtime import set_threads; from {module} import {func}; "
            f"a = json.loads(sys.argv[1]); set_threads(a.pop()); print(json.dumps({func}(*a)))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([*args, threads or torch.get_num_threads()])],
                          capture_output=True, text=True, env={**os.environ, **(MMAP_ENV if env is None else env)})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["killed"])[-1]
        raise RuntimeError(f"{what or f'{module}.{func}'} failed: {tail[:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])

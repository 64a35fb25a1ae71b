"""Shared measuring helpers for benchmarks (see ../shared/MEASURING.md): context, calibration, medians.

Threads, denormals, the device and the machine context come from attnlab.runtime, as everywhere else."""
from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from attnlab.runtime import cpu_name, machine_context, set_threads
from attnlab.timing import matmul_peak, memory_bandwidth, time_calls

__all__ = ["context", "cpu_name", "matmul_peak_flops", "memory_bandwidth", "product_peak_ops", "round_order",
           "set_threads", "summarize", "timed_call", "write_json"]


RESULTS = Path(__file__).resolve().parent / "results"  # reference results: clean tree, named commit
NOT_REFERENCE = "not-reference"  # beside them: runs that cannot be references, kept for their figures


def rerun_limited_to_avx2() -> None:
    """Re-run this script in a new process held to AVX2 (attnlab.runtime.AVX2_ONLY_ENV: an AVX2-only machine
    emulated here; torch reads it at import, so this process cannot change). Returns only in a process that
    already runs so; the results JSON's context shows the limits (``isa_limits``)."""
    import os
    import sys

    from attnlab.runtime import AVX2_ONLY_ENV

    if all(os.environ.get(k) == v for k, v in AVX2_ONLY_ENV.items()):
        return
    print("re-running held to AVX2: " + " ".join(f"{k}={v}" for k, v in AVX2_ONLY_ENV.items()), flush=True)
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **AVX2_ONLY_ENV})


def matmul_peak_flops() -> float:
    """Best-of fp32 matmul FLOP/s on this machine, now (the 'peak' our figures are shares of), over torch's own
    product (MKL) and oneDNN's where torch has it: the engine's prefill takes the faster (attnlab.engine.many_rows)."""
    return matmul_peak(seconds=0.3, onednn=True)


def product_peak_ops(dtype: str, n: int = 2048, repeats: int = 9) -> float:
    """Best OP/s of an n x n by n x n product (2 n^3 a call, the fastest of ``repeats`` after a warm-up) in ``dtype``
    on this CPU now, at the threads in force: "bf16", torch's product of bf16 tensors (oneDNN's where the CPU has it); "int8", torch's ``_int_mm`` (int32
    sums). An int8 model's products run on bf16 activations, widened or quantized too (engine.quantize's w8a8),
    whichever is faster: judged against the fp32 peak alone, such a row could pass 100% of it on arithmetic that peak
    does not measure. 0.0 where this build has no such product."""
    if dtype == "int8":
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8)
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8)
        product = lambda: torch._int_mm(a, b)
    elif dtype == "bf16":
        a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
        product = lambda: a @ b
    else:
        raise ValueError(f"dtype {dtype!r}: bf16 or int8 (the fp32 peak is matmul_peak_flops)")
    try:
        product()  # the warm-up, and whether this build has the product at all
    except RuntimeError:
        return 0.0
    return 2 * n ** 3 / time_calls(product, repeats, warmup=0)["min_s"]


def context(seed: int = 0, dtype: str = "fp32", device: str = "cpu") -> dict:
    """CPU model and capability, bf16 support, AMX, GPU, device, threads, torch version, seed, command, date."""
    return machine_context(seed, dtype, device)


def summarize(values: list[float]) -> dict:
    """Median and spread (min, max) of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def round_ratios(a: list[float], b: list[float]) -> dict:
    """Per-round a/b (both timed in the same round): median, min, max."""
    return summarize([x / y for x, y in zip(a, b)])


def timed_call(fn):
    """(wall seconds, result) of fn(): the benchmark's own clock, read just before the call and just after it
    returns, whatever library is under test (MEASURING.md: one clock for both sides)."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def round_order(names: list, r: int) -> list:
    """The order of round r: forward in even rounds, reversed in odd ones (A B, B A, ...: ABBA for two sides),
    so a drift in the machine's speed falls on every side alike over an even number of rounds."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def write_json(path: str | Path, data: dict) -> Path:
    """Write a benchmark's results. A run that cannot be a reference (a dirty tree, no commit) says so in its JSON
    (``reference``) and, when aimed at benchmarks/results/, lands in its not-reference/ folder instead: only a
    clean tree at a named commit can be rerun to check a figure."""
    from attnlab.report import reference_status

    if isinstance(data.get("context"), dict):  # whether attnlab's compiled kernels ran is known only by now
        from attnlab import kernels
        from attnlab.kernels import paths
        data["context"]["attnlab_kernels"] = kernels.status()
        data["context"]["kernel_paths"] = paths.snapshot()  # which compiled paths and fallbacks the run took
        data["reference"] = reference_status(data["context"])
    path = Path(path)
    if data.get("reference", {}).get("usable") is False and path.parent.resolve() == RESULTS.resolve():
        path = RESULTS / NOT_REFERENCE / path.name
        print(f"not a reference run ({data['reference']['why']}): writing {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


class JsonLinesProcess:
    """A child process driven by JSON lines: a request is one line on its stdin, its answer one line on its stdout (an
    answer holding "error" raises here). Each side of a comparison runs in one (serve_sides.SideProcess,
    vs_ctranslate2.Side), so no side shares a process with another library or with the load generator."""

    def __init__(self, cmd: list[str], what: str):
        self.what = what
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.what} exited with {self.proc.wait()}")
        res = json.loads(line)
        if "error" in res:
            raise RuntimeError(res["error"])
        return res

    def request(self, obj: dict) -> dict:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)

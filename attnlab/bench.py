"""``attnlab bench attention``: time and peak memory of each attention kernel (and the linear-attention
and SSM mixers) at each sequence length, every configuration in a fresh subprocess.

Peak memory follows ../shared/MEASURING.md: the child's max RSS minus its resident size after imports and
input allocation, so the figure is what the kernel itself needs (on CUDA: torch.cuda.max_memory_allocated
above the inputs, and every timed call synchronised). One untimed warm-up call precedes the timed repeats,
so the process's cold first call is not in the median. A configuration whose predicted
need exceeds the memory budget is not run (reported with the prediction) rather than risking the
machine. Inputs: batch 1, causal, q/k/v of shape (1, H, T, D).
"""
from __future__ import annotations

import json
import math
import resource
import statistics
import subprocess
import sys
import time

import torch

MIXERS = ("linear", "ssm")  # not softmax kernels: the same (H, D) width run through the other mixers


def predicted_bytes(kernel: str, T: int, H: int, D: int, dtype_bytes: int = 4) -> int:
    """What the kernel's largest temporaries need: naive ~3 T x T score-sized tensors; others O(T)."""
    if kernel == "naive":
        return 3 * H * T * T * dtype_bytes
    return 64 * H * T * D * dtype_bytes


def _run_one(kernel: str, T: int, H: int, D: int, repeats: int, dtype: str, device: str = "cpu") -> dict:
    from attnlab.models.attention import KERNELS
    from attnlab.models.linear import linear_parallel, phi
    from attnlab.models.ssm import selective_scan
    from attnlab.models.sparse import default_block, pairs_scored
    from attnlab.runtime import synchronize

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    on = dict(dtype=dt, device=device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=g).to(**on) for _ in range(3))
    if kernel == "ssm":
        E, N = H * D, 16
        u = q.transpose(1, 2).reshape(1, T, E)
        delta = torch.nn.functional.softplus(k.transpose(1, 2).reshape(1, T, E))
        Bt, Ct = torch.randn(1, T, N, **on), torch.randn(1, T, N, **on)
        A = -torch.arange(1, N + 1, **on).repeat(E, 1)
        fn = lambda: selective_scan(u, delta, A, Bt, Ct, torch.ones(E, **on), torch.zeros(1, E, N, **on), chunk=256)
        pairs = None
    elif kernel == "linear":
        fq, fk = phi(q), phi(k)
        fn = lambda: linear_parallel(fq, fk, v, torch.zeros(1, H, D, D, **on), torch.zeros(1, H, D, **on), 64)
        pairs = None
    else:
        kw = dict(causal=True, alibi_slopes=None, scale=D ** -0.5)
        if kernel == "sliding":
            kw["window"] = 256
        if kernel == "block_sparse":
            kw["block_size"] = default_block(T)
        fn = lambda: KERNELS[kernel](q, k, v, **kw)
        pairs = {"sliding": sum(min(i + 1, 256) for i in range(T)), "block_sparse": pairs_scored(T, default_block(T))
                 }.get(kernel, T * (T + 1) // 2)
    cuda = torch.device(device).type == "cuda"
    if cuda:  # GPU memory: torch's own peak counter, above what the inputs hold (MEASURING.md)
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _current_rss()  # what the process holds now (inputs included); the peak above it is the kernel's
    times = []
    with torch.inference_mode():
        # Untimed warm-up, same inputs: each configuration runs in a fresh process, whose first call pays for
        # one-time setup (kernel dispatch, allocator growth, library init) that is not the kernel's cost. After
        # `base`, so the peak still counts the kernel's own temporaries: peak is a high-water mark (max RSS /
        # max_memory_allocated), and the warm-up reaches the same peak as a timed call, so it changes nothing.
        fn()
        synchronize(device)
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - t)
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"kernel": kernel, "seq_len": T, "time_s": statistics.median(times), "time_min_s": min(times),
            "time_max_s": max(times), "repeats": len(times), "peak_bytes": peak, "pairs_scored": pairs, "status": "ok"}


def _current_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:  # no procfs: fall back to the high-water mark (under-reports small kernels)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# Peak memory of several configurations in one fresh process (the experiments use this; `bench attention` runs one
# process per configuration instead). With glibc's mmap threshold fixed, every allocation over 64 KiB is a mapping of
# its own, unmapped when freed, so resident bytes follow the live tensors rather than what malloc keeps for later;
# resetting the peak (VmHWM) before each configuration makes its high-water mark that configuration's alone.
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def resident_bytes(key: str = "VmRSS") -> int | None:
    """The process's resident bytes now (VmRSS) or at their peak since the last reset (VmHWM); None without procfs."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_resident() -> None:
    """Set VmHWM to the current VmRSS (Linux >= 4.0: writing 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def run_fresh(module: str, func: str, args: list, threads: int | None = None):
    """``module.func(*args)`` in a fresh Python process with MMAP_ENV set; returns its JSON result. Raises
    RuntimeError with the child's last error line if it fails."""
    import os

    code = (f"import json, sys; from attnlab.runtime import set_threads; from {module} import {func}; "
            f"a = json.loads(sys.argv[1]); set_threads(a.pop()); print(json.dumps({func}(*a)))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([*args, threads or torch.get_num_threads()])],
                          capture_output=True, text=True, env={**os.environ, **MMAP_ENV})
    if proc.returncode != 0:
        raise RuntimeError((proc.stderr.strip().splitlines() or ["killed"])[-1][:200])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_attention(kernels: list[str], seq_lens: list[int], heads: int = 12, head_dim: int = 64, repeats: int = 3,
                    budget_bytes: float = 16 * 2**30, dtype: str = "fp32", threads: int | None = None,
                    progress=None, device: str = "cpu") -> list[dict]:
    from attnlab.errors import AttnlabError
    from attnlab.models.attention import KERNELS

    unknown = [k for k in kernels if k not in KERNELS and k not in MIXERS]
    if unknown:
        raise AttnlabError(f"unknown kernel(s) {', '.join(unknown)}; choose from {', '.join(list(KERNELS) + list(MIXERS))}")
    if any(T <= 0 for T in seq_lens):
        raise AttnlabError("sequence lengths must be > 0")
    rows = []
    for T in seq_lens:
        for kernel in kernels:
            need = predicted_bytes(kernel, T, heads, head_dim)
            if need > budget_bytes:
                rows.append({"kernel": kernel, "seq_len": T, "time_s": None, "peak_bytes": None, "status":
                             f"skipped: would need about {need / 2**30:.1f} GiB (budget {budget_bytes / 2**30:.0f} GiB)"})
                continue
            cmd = [sys.executable, "-c", "import json,sys; from attnlab.bench import _child; _child()",
                   json.dumps([kernel, T, heads, head_dim, repeats, dtype, threads or torch.get_num_threads(),
                               str(device)])]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["killed"]
                rows.append({"kernel": kernel, "seq_len": T, "time_s": None, "peak_bytes": None,
                             "status": f"failed: {tail[0][:200]}"})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if progress:
                progress(rows[-1])
    return rows


def _child() -> None:
    from attnlab.runtime import resolve_device, set_threads

    kernel, T, H, D, repeats, dtype, threads, device = json.loads(sys.argv[1])
    set_threads(threads)
    print(json.dumps({**_run_one(kernel, T, H, D, repeats, dtype, str(resolve_device(device))), "device": device}))


def growth_exponent(rows: list[dict], kernel: str) -> float | None:
    """Least-squares slope of log(time) on log(T) over the lengths this kernel ran at."""
    pts = [(math.log(r["seq_len"]), math.log(r["time_s"])) for r in rows if r["kernel"] == kernel and r.get("time_s")]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None

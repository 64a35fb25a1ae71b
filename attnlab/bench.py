"""``attnlab bench attention``: time and peak memory of each attention kernel (and the linear-attention
and SSM mixers) at each sequence length, every configuration in a fresh subprocess.

Peak memory follows ../shared/MEASURING.md: the child's resident high-water mark above its resident size after
imports and input allocation (timing.PeakMemory), so the figure is what the kernel itself needs (on CUDA:
torch.cuda.max_memory_allocated above the inputs, and every timed call synchronised). One untimed warm-up call
precedes the timed repeats, so the process's cold first call is not in the median. A configuration whose predicted
need exceeds the memory budget is not run (reported with the prediction) rather than risking the
machine. Inputs: batch 1, causal, q/k/v of shape (1, H, T, D).
"""
from __future__ import annotations

import math

import torch

from attnlab.timing import PeakMemory, run_fresh, time_calls

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
    # Memory: the most held above what the process holds now (inputs included), so the figure is the kernel's
    # own; the untimed warm-up inside time_calls reaches the same peak as a timed call, so it changes nothing.
    peak = PeakMemory(device).start()
    with torch.inference_mode():
        t = time_calls(fn, repeats, 1, device=device)
    return {"kernel": kernel, "seq_len": T, "time_s": t["median_s"], "time_min_s": t["min_s"], "time_max_s": t["max_s"],
            "repeats": repeats, "peak_bytes": peak.peak_bytes(), "pairs_scored": pairs, "status": "ok"}


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
            try:  # a fresh process each: its own peak, its own allocator, no warm caches
                rows.append(run_fresh("attnlab.bench", "run_one", [kernel, T, heads, head_dim, repeats, dtype, str(device)],
                                      threads, env={}, what=f"{kernel} at {T} tokens"))
            except RuntimeError as e:
                rows.append({"kernel": kernel, "seq_len": T, "time_s": None, "peak_bytes": None, "status": f"failed: {e}"})
            if progress:
                progress(rows[-1])
    return rows


def run_one(kernel: str, T: int, H: int, D: int, repeats: int, dtype: str, device: str) -> dict:
    """One configuration, in the process that calls it (bench_attention runs each in a fresh one)."""
    from attnlab.runtime import resolve_device

    return {**_run_one(kernel, T, H, D, repeats, dtype, str(resolve_device(device))), "device": device}


def growth_exponent(rows: list[dict], kernel: str) -> float | None:
    """Least-squares slope of log(time) on log(T) over the lengths this kernel ran at."""
    pts = [(math.log(r["seq_len"]), math.log(r["time_s"])) for r in rows if r["kernel"] == kernel and r.get("time_s")]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None

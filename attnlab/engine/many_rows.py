"""The product for prefill-sized calls (more than kernels.MAX_ROWS rows) of an inference Linear, chosen by
measurement per shape on the machine it runs on.

Such a call is compute-bound (each weight is read once for hundreds of rows), so what decides its speed is the
GEMM library, and which library is fastest depends on the CPU: torch's F.linear sends an fp32 product to MKL and a
bf16 one to oneDNN, and MKL's AVX-512 kernels are written for Intel CPUs, so on an AMD one oneDNN can be twice as
fast over the same weight, while on an Intel one either may win (docs/engine.md has the figures). So each shape is
timed once per process on both and the faster kept:

- ``linear``: F.linear (torch's own choice of library);
- ``onednn``: ``torch.ops.mkldnn._linear_pointwise`` over the same (out, in) weight, laid out as it is: no second
  copy of the weights (at prefill sizes oneDNN reads a plain weight about as fast as its prepacked layout).

Both are fp32 arithmetic on fp32 inputs (oneDNN sums in another order: ~1e-6 relative).

A decode step of a large batch (17 to ~100 rows) is a product of another kind than a prompt's: each weight is read for
a few dozen rows, so how a library streams the weight, and whether it repacks it per call (MKL does), weighs more than
its peak. The two are chosen apart (``bucket``), each at a row count of its own kind (``PROBE_ROWS``); docs/engine.md
has the figures.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab.timing import time_calls

PATHS = ("linear", "onednn")
BATCH_MAX = 96  # calls of up to this many rows are a batch's decode step; more, a prompt
# The row count each kind of call is timed at: a large batch's decode step; a short prompt's worth (both libraries
# past their few-row ramp).
PROBE_ROWS = {"batch": 64, "prompt": 128}
PROBE_CALLS = 3  # best of 3, after one untimed call
_chosen: dict = {}  # (in, out, dtype, bias, transposed, bucket) -> path, measured once per process


def bucket(rows: int) -> str:
    """The kind of call ``rows`` rows make: "batch" (a decode step of many sequences) or "prompt"."""
    return "batch" if rows <= BATCH_MAX else "prompt"


def candidates(weight: torch.Tensor) -> tuple[str, ...]:
    """The paths that can run this weight on this machine: oneDNN for fp32 and bf16 on a CPU with oneDNN."""
    if weight.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16) and \
            torch.backends.mkldnn.is_available():
        return PATHS
    return ("linear",)


def choose(weight: torch.Tensor, bias: torch.Tensor | None, rows: int = PROBE_ROWS["prompt"]) -> str:
    """The faster path for calls of ``rows`` rows (their ``bucket``) against ``weight`` (out, in) (and ``bias``),
    timed on first sight of the shape and bucket, and remembered."""
    paths = candidates(weight)
    if len(paths) == 1:
        return paths[0]
    kind = bucket(rows)
    key = (weight.shape[1], weight.shape[0], weight.dtype, bias is not None, not weight.is_contiguous(), kind)
    if key not in _chosen:
        x = torch.randn(PROBE_ROWS[kind], weight.shape[1]).to(weight.dtype)
        best, best_s = "linear", float("inf")
        for path in paths:
            try:
                with torch.inference_mode():
                    took = time_calls(lambda: linear(path, x, weight, bias), PROBE_CALLS, 1)["min_s"]
            except RuntimeError:  # a path this build cannot run at this shape or dtype
                continue
            if took < best_s:
                best, best_s = path, took
        _chosen[key] = best
    return _chosen[key]


def linear(path: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, in) @ weight (out, in)^T + bias -> (M, out) on ``path``. oneDNN's op has no backward, so a call that
    autograd would record runs F.linear."""
    if path == "onednn" and not (torch.is_grad_enabled() and x.requires_grad):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)

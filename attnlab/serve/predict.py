"""The cost model's prediction for one request on this machine, shown on the page beside the measurement.

Same roofline as ``attnlab cost`` (attnlab/cost/analytic.py) on this machine's calibrated figures
(``measure.local.local()``: measured once, cached on disk). A prefix-cache hit changes only the prefill:
``prompt - cached`` new tokens attend to ``prompt`` keys instead of the whole prompt being run; the page
shows both, which is what the turn would have cost without the cache.
"""
from __future__ import annotations

import threading

from attnlab.cost import analytic
from attnlab.cost.arch import from_model_config

_hw = None
_hw_lock = threading.Lock()


def hardware(cancel: threading.Event | None = None):
    """This machine's spec, measured once per process (or read from the disk cache); ``cancel`` stops a
    measurement in progress (``measure.micro.Cancelled``), as a server shutting down does."""
    global _hw
    with _hw_lock:
        if _hw is None:
            from attnlab.measure.local import local

            _hw = local(cancel=cancel)
        return _hw


def ready() -> bool:
    """Whether this machine's spec is measured (or read from the disk cache) in this process already."""
    return _hw is not None


def _forward_s(a, hw, dtype: str, T: int, S: int, head_rows: int | None) -> float:
    ops = analytic.OPS_PER_LAYER * a.n_layers + 4
    return analytic.roofline_s(analytic.forward_flops(a, T, S, head_rows=head_rows)["total"],
                               analytic.forward_bytes(a, T, S, 1, dtype, head_rows=head_rows)["total"], hw, dtype, ops,
                               analytic.typical_matmul_size(a, T),
                               analytic.forward_elementwise(a, T, S, sampled_rows=1)["total"])


def predict(cfg, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0, dtype: str = "fp32",
            cancel: threading.Event | None = None) -> dict:
    """Predicted TTFT (with and without the cached prefix), TPOT at the request's mid-point, and KV bytes."""
    a = from_model_config(cfg)
    hw = hardware(cancel)
    cached = min(max(cached_tokens, 0), prompt_tokens - 1)  # the last prompt token is always run (it gives logits)
    ttft = _forward_s(a, hw, dtype, prompt_tokens - cached, cached, 1)
    ttft_uncached = _forward_s(a, hw, dtype, prompt_tokens, 0, 1)
    tpot = _forward_s(a, hw, dtype, 1, prompt_tokens + max(output_tokens, 1) // 2, None)
    per_token = analytic.kv_bytes_per_token(a, dtype) if a.family == "transformer" else 0
    return {"ttft_s": ttft, "ttft_uncached_s": ttft_uncached, "tpot_s": tpot,
            "total_s": ttft + tpot * max(output_tokens - 1, 0), "kv_bytes_per_token": per_token,
            "kv_bytes": per_token * (prompt_tokens + output_tokens), "hardware": hw.name}

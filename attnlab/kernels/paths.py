"""Which path ran: a count of each compiled kernel's calls and of each fallback, with its reason.

A fast path that does not apply falls back to torch's kernels, which compute the same function, so nothing but
the speed shows which ran. These counts make it visible: the engine's ``stats()``, the server's ``/metrics``, the
report's results and the benchmarks' JSON carry them. Two kinds of entry:

- ``ran(path)``: a path taken by design (``block_decode``, ``prefill_attention``, or the plain ``forward`` of a
  prefill or of a kernel under study, which the compiled step never replaces);
- ``fell_back(path, why)``: the compiled path was wanted and could not run (no compiled kernels here, a weight in
  a layout the step cannot read, a dtype it does not take). Announced once per reason (a warning), then counted.

The counts are process-wide, as a server's metrics are: every model in the process adds to them. ``snapshot()``
before and ``since(before)`` after a piece of work give that work's own counts.
"""
from __future__ import annotations

import threading
import warnings
from collections import Counter

_counts: Counter = Counter()
_announced: set = set()
_lock = threading.Lock()  # the server's engine thread counts while a request thread reads /metrics


def ran(path: str, n: int = 1) -> None:
    """Count ``n`` calls of ``path``, a path taken by design."""
    with _lock:
        _counts[path] += n


def fell_back(path: str, why: str, n: int = 1) -> None:
    """Count ``n`` calls that wanted the compiled ``path`` and ran torch's instead, because ``why``; the first of
    each (path, why) is announced."""
    key = f"{path} fallback: {why}"
    with _lock:
        _counts[key] += n
        first = key not in _announced
        _announced.add(key)
    if first:
        warnings.warn(f"attnlab: {path} not used ({why}); running torch's kernels instead (same result, slower)",
                      RuntimeWarning, stacklevel=3)


def snapshot() -> dict[str, int]:
    """Every count so far, by path (a copy)."""
    with _lock:
        return dict(_counts)


def since(before: dict[str, int]) -> dict[str, int]:
    """The counts added after ``before`` (a ``snapshot()``), the paths with none left out."""
    now = snapshot()
    return {k: v - before.get(k, 0) for k, v in sorted(now.items()) if v - before.get(k, 0)}

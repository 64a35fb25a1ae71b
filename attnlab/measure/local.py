"""This machine's measured hardware spec: the micro-benchmarks of ``calibrate`` run now, or read back from
~/.cache/attnlab/, keyed by CPU, thread count, torch version and calibration version (``CALIBRATION_VERSION``).

The figures become a ``cost.hardware.Hardware`` through ``cost.hardware.from_micro``; the cost library itself never
measures.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from attnlab import runtime
from attnlab.cost.hardware import Hardware, from_micro, get

GB = 1e9
# Bumped whenever the micro-benchmarks or the fields they record change, so an older cache entry (other fields,
# other shapes) is measured again.
CALIBRATION_VERSION = 16


def _cache_path() -> Path:
    from attnlab.runtime import cache_dir

    return cache_dir() / "hardware-local.json"


def _ram_bytes() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 * GB


def calibrate(dtypes: tuple[str, ...] | None = None, modules: dict | None = None,
              cancel: threading.Event | None = None, composed: dict | None = None) -> Hardware:
    """Measure this machine now with the micro-benchmarks of ``calibrate`` (matmul throughput and weight streaming
    per dtype, attention, elementwise kernels, per-op overhead, memory bandwidth; each at shapes no validated model
    uses). ``dtypes``: fp32 and whichever of bf16 / int8 this CPU runs natively (runtime.fast_dtypes).
    ``modules``: matrices kept between calibrations in one process (matmul_tables.linear_tables). ``cancel``: an Event
    that stops the measuring early (``micro.Cancelled`` is raised; see calibrate.run). ``composed``: an earlier
    calibration's whole-model ratios to keep (calibrate.run)."""
    import torch

    from attnlab.measure import calibrate as cal
    from attnlab.runtime import cpu_name, fast_dtypes

    dtypes = tuple(dtypes or (d for d in fast_dtypes("cpu") if d != "int8"))
    micro = cal.run(dtypes, modules, cancel, composed)
    source = (f"measured {time.strftime('%Y-%m-%d %H:%M')} on {cpu_name()}, {torch.get_num_threads()} threads, "
              f"torch {torch.__version__}, micro-benchmarks v{CALIBRATION_VERSION} ({micro['seconds']:.0f} s)")
    return from_micro(micro, ram_bytes=_ram_bytes(), cache_bytes=runtime.last_level_cache_bytes(), source=source)


def _local_key() -> str:
    import torch

    from attnlab.runtime import cpu_name

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


def spec(name: str, refresh: bool = False) -> Hardware:
    """A spec by name: ``local`` measured on the running machine (``refresh``: again), any other from the datasheets."""
    return local(refresh) if name == "local" else get(name)

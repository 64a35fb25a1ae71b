"""Kernels attnlab compiles on the machine that runs them (once, cached), with torch's kernels as the fallback.

``few_rows()`` returns the compiled module of ``few_rows.cpp`` (a few rows times an fp32, bf16 or int8 weight, in
fp32 arithmetic: the decode-sized product torch's own kernels stream slowly on the CPUs here), or None where it
cannot be had: no C++ compiler or Python headers, a failed build, or ``ATTNLAB_KERNELS=0`` (which benchmarks use to time
the fallback side by side). The build (torch.utils.cpp_extension, about 30 s on 2 cores) happens on first use and
is cached under torch's extension folder, keyed by the source and this CPU's instruction sets (the code is built
with -march=native, so a build from another CPU is never loaded).
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("few_rows.cpp")
# -ffp-contract=off: the compiler may not fuse a multiply and an add in one place and not in another, so every
# (row, channel) sum rounds the same way whichever code path (rows in fours, twos, ones) computes it.
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off"]
MAX_ROWS = 16  # above this many rows a call is prefill-sized: the library's GEMMs (oneDNN, AMX) win there
_state: dict = {}


def enabled() -> bool:
    return os.environ.get("ATTNLAB_KERNELS", "1") != "0"


def _cpu_key() -> str:
    """A short hash of this CPU's model and instruction-set flags (a -march=native build is only valid here)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next((ln for ln in info.splitlines() if ln.startswith("model name")), "")
        flags = next((ln for ln in info.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        import platform
        model, flags = platform.processor(), platform.machine()
    return hashlib.sha256((model + flags).encode()).hexdigest()[:10]


def few_rows():
    """The compiled few-rows linear module, or None (see the module's docstring); warns once on failure."""
    if not enabled():
        return None
    if "few_rows" in _state:
        return _state["few_rows"]
    mod = None
    try:
        import torch.utils.cpp_extension as ext

        name = f"attnlab_few_rows_{_cpu_key()}"
        built = Path(ext._get_build_directory(name, verbose=False)) / f"{name}.so"
        if not built.exists():
            print("attnlab: building its decode kernel for this CPU (once, about 30 s)",
                  file=sys.stderr, flush=True)
        mod = ext.load(name, [str(SOURCE)], extra_cflags=CFLAGS, verbose=False)
    except Exception as e:  # no compiler, no headers, a build error: torch's kernels instead
        warnings.warn(f"attnlab could not build its decode kernel ({type(e).__name__}: "
                      f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}); decoding uses torch's kernels, "
                      "which are slower on some CPUs. Install a C++ compiler (g++) and the Python headers "
                      "to get it, or set ATTNLAB_KERNELS=0 to silence this.", stacklevel=2)
    _state["few_rows"] = mod
    return mod

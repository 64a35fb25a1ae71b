"""Kernels attnlab compiles on the machine that runs them (once, cached), with torch's kernels as the fallback.

``native()`` returns the compiled module, or None where it cannot be had. It holds ``linear`` (few_rows.cpp: a few
rows times an fp32, bf16 or int8 weight, in fp32 arithmetic, or for int8 where ``int8_rows_as_int16()`` (VNNI) in
exact integer sums against rows quantized to int16: the decode-sized product torch's own kernels stream slowly on
the CPUs here), ``decode_attention`` (decode_attention.cpp: one query per row over each row's own keys,
contiguous or paged, fp32 or bf16, every row and head in one call), ``block_decode``
(block_step.cpp: a transformer block's whole decode step, cache write and attention included, in one call),
``block_pre`` / ``block_post`` (the same step in two calls around Python's attention, where the cache cannot
say where its keys go), ``gelu_tanh_`` / ``gelu_tanh_forward`` / ``gelu_tanh_backward`` (activations.h: the
prefill's GELU in place, fp32 or bf16, training's forward and backward), ``quantize_rows_int8`` /
``scale_rows_int32`` (int8_rows.cpp: the two ends of Int8Linear's integer prefill product), ``rope_apply``
(rope.cpp: rotary over a whole (B, H, T, D) tensor, or its transpose), ``evict`` (evict.cpp: flush a tensor from
the caches, for cold timings) and ``ssm_scan_forward`` / ``ssm_scan_backward`` (ssm_scan.cpp: the SSM's
sequential scan with each channel's state in registers). None: no C++ compiler or Python headers, a failed build, or
``ATTNLAB_KERNELS=0`` (which benchmarks use to time the fallback side by side). The build
(torch.utils.cpp_extension, under a minute on 2 quiet cores) happens on first use and is cached under torch's
extension folder, keyed by the sources and this CPU's instruction sets (the code is built with -march=native, so a
build from another CPU is never loaded).
"""
from __future__ import annotations

import hashlib
import sys
import time
import warnings
from pathlib import Path

SOURCES = [Path(__file__).with_name(n) for n in ("few_rows.cpp", "decode_attention.cpp", "prefill_attention.cpp",
                                                   "block_step.cpp", "ssm_scan.cpp", "rope.cpp",
                                                   "activations.h", "evict.cpp", "int8_rows.cpp", "bindings.cpp",
                                                   "simd.h")]
BUILT = Path(__file__).with_name("bindings.cpp")  # the one unit compiled: it includes the others
# -ffp-contract=off: the compiler may not fuse a multiply and an add in one place and not in another, so every
# (row, channel) sum rounds the same way whichever code path (rows in fours, twos, ones) computes it.
# -fopenmp: at::parallel_for is OpenMP in torch's headers and runs serially without it; torch's own libgomp.so.1 is
# loaded already, so the extension shares its thread pool (same soname) rather than starting a second one.
CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp"]  # and arch_flags(): -march=native as a rule
STALE_LOCK_S = 600  # a build takes about a minute; a lock this old belongs to a build that was killed
MAX_ROWS = 16  # above this many rows a call is prefill-sized: the library's GEMMs (oneDNN, AMX) win there
_state: dict = {}


def enabled() -> bool:
    from attnlab.runtime import kernels_enabled

    return kernels_enabled()


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


def arch_flags() -> list[str]:
    """-march=native, unless torch is held to AVX2 on a wider CPU (ATEN_CPU_CAPABILITY=avx2, as
    runtime.AVX2_ONLY_ENV sets to emulate an AVX2-only machine): then x86-64-v3 (AVX2 and FMA), so these kernels
    use what torch's own do and simd.h takes its AVX2 branch."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "AVX2" and "avx512f" in _cpu_flags():
        return ["-march=x86-64-v3", "-mtune=native"]
    return ["-march=native"]


def _cpu_flags() -> set[str]:
    try:
        line = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def _sources_hash() -> str:
    """Of every source, the included ones too (torch's own rebuild check sees only the compiled file), and flags."""
    flags = " ".join(CFLAGS + arch_flags()).encode()
    return hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES) + flags).hexdigest()[:12]


def status() -> str:
    """For results JSONs, without building anything: "loaded", "unavailable" (a build failed), "disabled"
    (ATTNLAB_KERNELS=0) or "not used" (nothing in this process asked for them)."""
    if not enabled() or _state.get("disabled"):
        return "disabled"
    if "native" not in _state:
        return "not used"
    return "loaded" if _state["native"] is not None else "unavailable"


def native():
    """The compiled module, or None (see the module's docstring); warns once on failure. ATTNLAB_KERNELS is read
    at the first call (a decode step asks several times a layer; the environment lookup showed in its profile)."""
    if "native" in _state:
        return _state["native"]
    if not enabled():
        _state["native"] = None
        _state["disabled"] = True
        return None
    mod = None
    try:
        import torch.utils.cpp_extension as ext

        name = f"attnlab_native_{_cpu_key()}_{_sources_hash()}"  # a change of either: a build of its own
        folder = Path(ext._get_build_directory(name, verbose=False))
        built = folder / f"{name}.so"
        # A torch whose build lock is a file that blocks by existing (FileBaton) leaves it behind when a build is
        # killed midway, and every later build would wait on it forever. A torch that holds an OS lock on the file
        # (FileLock) keeps the file between builds and the OS frees the lock with its holder: nothing to remove
        # there, and removing it could let two builds run at once.
        lock = folder / "lock"
        existence_lock = hasattr(ext, "FileBaton") and not hasattr(ext, "FileLock")
        if existence_lock and lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            print(f"attnlab: removing a stale kernel build lock ({lock}, from a build that did not finish)",
                  file=sys.stderr, flush=True)
            lock.unlink(missing_ok=True)
        if not built.exists():
            print("attnlab: building its decode kernels for this CPU (once, about a minute)",
                  file=sys.stderr, flush=True)
        mod = ext.load(name, [str(BUILT)], extra_cflags=CFLAGS + arch_flags(), extra_ldflags=["-fopenmp"],
                       verbose=False)
    except Exception as e:  # no compiler, no headers, a build error: torch's kernels instead
        warnings.warn(f"attnlab could not build its decode kernels ({type(e).__name__}: "
                      f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}); decoding uses torch's kernels, "
                      "which are slower on some CPUs. Install a C++ compiler (g++) and the Python headers "
                      "to get it, or set ATTNLAB_KERNELS=0 to silence this.", stacklevel=2)
    _state["native"] = mod
    return mod

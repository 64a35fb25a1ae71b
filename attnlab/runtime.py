"""Where code runs, decided in one place: threads, denormals, the device, what the CPU can do natively,
which dtypes are worth running, and the machine context every result records.

Why one place: the same model ran 14x slower with denormal floats, and a bf16 matmul is ~100x slower than
fp32 on a CPU that only emulates bf16 (AVX2, no avx512_bf16 or AMX); sessions land on both kinds of CPU
(../shared/MEASURING.md). Every entry point (CLI, report, benchmarks, measuring subprocesses) calls
``set_threads`` and ``resolve_device`` from here, and every results JSON carries ``machine_context()``.
"""
from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import AttnlabError

DEVICES = ("cpu", "cuda")
DTYPES = ("fp32", "bf16", "fp16", "int8")  # int8: int8 weights, bf16 activations (engine/quantize.py)


# An AVX2-only machine, emulated on a wider CPU: torch's kernels, oneDNN (bf16 and prepacked matmuls) and MKL (fp32
# GEMM) held to AVX2, and attnlab's own kernels built for x86-64-v3 (kernels._arch_flags reads torch's capability).
# It must be set before torch is imported: benchmarks re-run themselves with it (--as-avx2). The cores, caches and
# memory stay this machine's, so it tests the code paths an AVX2 CPU takes, not an AVX2 CPU's speed.
AVX2_ONLY_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


class EmulatedDtypeWarning(UserWarning):
    """A dtype was asked for that this hardware only emulates (it runs, but far slower than fp32)."""


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op threads (None: keep torch's default, one per core) and flush denormals to zero;
    returns the thread count in force. Denormals made a model 14x slower on these CPUs (MEASURING.md)."""
    if n is not None:
        if n < 1:
            raise AttnlabError(f"--threads {n} must be >= 1 (omit it to use torch's default of one per core)")
        torch.set_num_threads(n)
    torch.set_flush_denormal(True)
    return torch.get_num_threads()


def resolve_device(name: str | torch.device | None) -> torch.device:
    """'cpu' | 'cuda' | 'cuda:N' | None (-> cpu) as a torch.device; a device this machine lacks is an error
    naming the fix, never a silent fall back to the CPU."""
    if name is None:
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise AttnlabError(f"--device {name!r} is not a device; choose one of: {', '.join(DEVICES)}") from None
    if device.type not in DEVICES:
        raise AttnlabError(f"--device {name!r} is not supported; choose one of: {', '.join(DEVICES)}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support (a CPU-only build)"
            raise AttnlabError(f"--device {name}: torch sees no CUDA device (torch {torch.__version__}, built with "
                               f"{build}); use --device cpu, or run on a machine with an NVIDIA GPU and a CUDA "
                               "build of torch")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise AttnlabError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here; "
                               f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")
    return device


def synchronize(device: str | torch.device) -> None:
    """Wait for queued GPU work before reading a clock (a no-op on the CPU, whose ops return when done)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class CpuCapabilities:
    model: str  # /proc/cpuinfo's "model name" (platform.processor() elsewhere)
    capability: str  # torch.backends.cpu.get_cpu_capability(): the widest vector ISA torch's kernels use
    onednn_bf16: bool  # torch.ops.mkldnn._is_mkldnn_bf16_supported(): oneDNN accepts bf16 (maybe emulated)
    avx2: bool
    avx512f: bool
    avx512_bf16: bool  # bf16 dot products in AVX-512
    amx_bf16: bool  # Intel AMX tiles with bf16
    flags_known: bool  # False where /proc/cpuinfo has no flags line (then the two above are unknown)

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run in hardware: avx512_bf16 or AMX, and oneDNN (which runs torch's bf16 matmuls) may use
        them. Without either they are emulated, ~100x slower than fp32 (measured on an AVX2 session). oneDNN says
        no when held below the CPU (ONEDNN_MAX_CPU_ISA=AVX2: ``AVX2_ONLY_ENV``). Unknown flags: oneDNN decides."""
        return (self.avx512_bf16 or self.amx_bf16 or not self.flags_known) and self.onednn_bf16


def parse_cpuinfo(text: str) -> tuple[str | None, set[str] | None]:
    """(model name, x86 flags) from /proc/cpuinfo text; None for what it lacks (ARM lists "Features" instead of
    "flags": there the flags count as unknown and oneDNN's own answer decides)."""
    model, flags = None, None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    return model, flags


@functools.lru_cache(maxsize=1)
def cpu_capabilities() -> CpuCapabilities:
    """What this CPU offers torch (read once per process)."""
    try:
        model, flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        model, flags = None, None
    try:
        onednn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        onednn_bf16 = False
    known = flags is not None
    flags = flags or set()
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX2", "DEFAULT", "NO AVX"):  # torch held below the CPU (ATEN_CPU_CAPABILITY): the
        flags = flags - {"avx512f", "avx512_bf16", "amx_bf16"}  # process uses no AVX-512, so it counts as absent
    if capability in ("DEFAULT", "NO AVX"):
        flags = flags - {"avx2"}
    return CpuCapabilities(model=model or platform.processor() or platform.machine(),
                           capability=capability, onednn_bf16=onednn_bf16,
                           avx2="avx2" in flags, avx512f="avx512f" in flags, avx512_bf16="avx512_bf16" in flags,
                           amx_bf16="amx_bf16" in flags, flags_known=known)


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[text[-1]] if text[-1] in "KMG"
                         else int(text))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def cpu_name() -> str:
    return cpu_capabilities().model


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """Whether bf16 matmuls run natively on ``device`` (CUDA: torch.cuda.is_bf16_supported())."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_capabilities().native_bf16


def bf16_trains_faster(device: str | torch.device = "cpu", make_step=None) -> bool:
    """Whether training under bf16 autocast beats fp32 on ``device``: a GPU with bf16, a CPU with AMX tiles, or a
    CPU with native bf16 where the model's own step measures faster under autocast (``make_step()`` -> step(amp),
    one forward and backward: faster_under_autocast); without a step to time, fp32. The CPU's flags alone do not
    say it (oneDNN's bf16 products have run below its fp32 ones on one AVX-512 CPU and at twice their speed on
    another), nor does a product alone (a small model's step can be slower under autocast where its products are
    faster: the casts, and the attention outside them); claim 13's CHANGES has the measurements."""
    device = torch.device(device)
    if device.type == "cuda":
        return native_bf16(device)
    if not native_bf16(device):
        return False
    return cpu_capabilities().amx_bf16 or (make_step is not None and faster_under_autocast(make_step()))


BF16_TRAINS_FASTER_BY = 1.2  # a margin over timing noise, and over the optimizer step the timed step leaves out


def faster_under_autocast(step, rounds: int = 2) -> bool:
    """Times ``step(amp)`` in fp32 and under bf16 autocast, each warmed once, in alternating order, on one thread
    as the report's training jobs run (the caller's thread count restored); True if the autocast step's best is
    BF16_TRAINS_FASTER_BY faster than fp32's."""
    from attnlab.timing import time_calls  # timing imports this module

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step(False)
        step(True)
        best = {False: float("inf"), True: float("inf")}
        for r in range(rounds):
            for amp in ((False, True) if r % 2 == 0 else (True, False)):
                best[amp] = min(best[amp], time_calls(lambda: step(amp), repeats=1, warmup=0)["min_s"])
    finally:
        torch.set_num_threads(threads)
    return best[False] >= BF16_TRAINS_FASTER_BY * best[True]


def fast_dtypes(device: str | torch.device = "cpu") -> tuple[str, ...]:
    """The inference dtypes worth running on ``device``: fp32 always; bf16 and int8 (int8 weights, bf16
    activations) only where bf16 is native. A default or a sweep picks from these and nothing else."""
    return ("fp32", "bf16", "int8") if native_bf16(device) else ("fp32",)


def check_dtype(name: str, device: str | torch.device = "cpu") -> str | None:
    """Validate a dtype asked for explicitly; warn (EmulatedDtypeWarning) and return the message when the
    hardware only emulates it, else None. It still runs: the user asked for it, and is told the cost."""
    if name not in DTYPES:
        raise AttnlabError(f"dtype {name!r} is not supported; choose one of: {', '.join(DTYPES)}")
    device = torch.device(device)
    if name == "fp32":
        return None
    if name == "fp16":
        if device.type != "cpu":
            return None
        message = (f"--dtype fp16 on the CPU ({cpu_name()}): fp16 matmuls are emulated on most CPUs and run far "
                   "slower than fp32; use --dtype fp32")
    elif native_bf16(device):
        return None
    else:
        what = "bf16" if name == "bf16" else "int8, whose activations run in bf16,"
        if device.type == "cuda":
            where, cost = f"this GPU ({torch.cuda.get_device_name(device)}) has no native bf16", "far slower than fp32"
        else:
            caps = cpu_capabilities()
            where = (f"this CPU ({caps.model}, torch capability {caps.capability}) has no native bf16 matmul "
                     "(no avx512_bf16 or AMX)")
            cost = "about 100x slower than fp32"
        message = (f"--dtype {name}: {where}, so {what} is emulated, {cost}. "
                   "int8 runs bf16 activations too, so here fp32 is the fast choice: use --dtype fp32")
    warnings.warn(message, EmulatedDtypeWarning, stacklevel=2)
    return message


def code_version(ignore: tuple[str, ...] = ()) -> dict | None:
    """The git commit of the attnlab code running now and whether its tracked files had uncommitted changes,
    leaving out the folders in ``ignore`` (paths from the repository's top: a benchmark's own results folder, which
    its earlier runs have just written).

    Why: a result is only evidence if it can be traced to the code that produced it. None when the package is
    not in a git checkout (an installed wheel) or git is missing or slow; this never fails the caller.
    """
    here = str(Path(__file__).resolve().parent)

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ":/", *(f":(top,exclude){p}" for p in ignore))
    # status None (git failed halfway): unknown, recorded as None rather than guessed clean
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def _kernels_status() -> str:
    from attnlab import kernels  # here, not at the top: kernels is imported by model code that runtime precedes

    return kernels.status()


# --- environment settings: read here and nowhere else -------------------------------------------------------------
def cache_dir() -> Path:
    """attnlab's cache directory: $ATTNLAB_CACHE, else $XDG_CACHE_HOME/attnlab, else ~/.cache/attnlab."""
    if os.environ.get("ATTNLAB_CACHE"):
        return Path(os.environ["ATTNLAB_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnlab"


def kernels_enabled() -> bool:
    """False when ATTNLAB_KERNELS=0: torch's kernels only, attnlab's compiled ones neither built nor loaded."""
    return os.environ.get("ATTNLAB_KERNELS", "1") != "0"


def launcher_rank() -> int:
    """This process's rank as torchrun (or attnlab's own launcher) set it; 0 when not launched."""
    return int(os.environ.get("RANK", "0"))


def omp_wait_policy_set() -> bool:
    """Whether the user (or an earlier start) chose OpenMP's wait policy (OMP_WAIT_POLICY)."""
    return "OMP_WAIT_POLICY" in os.environ


def env_api_key() -> str | None:
    """The server's API key from the environment (ATTNLAB_API_KEY), so it need not appear on a command line."""
    return os.environ.get("ATTNLAB_API_KEY") or None


def machine_context(seed: int | None = None, dtype: str = "fp32", device: str | torch.device = "cpu") -> dict:
    """What every results and benchmark JSON records about where it ran (MEASURING.md, 'Record the context')."""
    device = torch.device(device)
    caps = cpu_capabilities()
    gpu = torch.cuda.get_device_name(device if device.type == "cuda" else None) if torch.cuda.is_available() else None
    return {"cpu": caps.model, "cpu_capability": caps.capability, "cpu_flags": {
                "avx2": caps.avx2, "avx512f": caps.avx512f, "avx512_bf16": caps.avx512_bf16, "amx_bf16": caps.amx_bf16,
                "known": caps.flags_known},
            "onednn_bf16": caps.onednn_bf16, "amx": caps.amx_bf16, "native_bf16": native_bf16(device),
            "last_level_cache_bytes": last_level_cache_bytes(),
            "gpu": gpu, "device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": sys.version.split()[0], "dtype": dtype, "seed": seed, "command": " ".join(sys.argv),
            "git": code_version(), "attnlab_kernels": _kernels_status(),
            "isa_limits": {k: os.environ[k] for k in AVX2_ONLY_ENV if k in os.environ},  # set: an emulated machine
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


__all__ = ["AVX2_ONLY_ENV", "CpuCapabilities", "DEVICES", "DTYPES", "EmulatedDtypeWarning", "cache_dir",
           "check_dtype", "code_version", "cpu_capabilities", "cpu_name", "env_api_key", "fast_dtypes",
           "kernels_enabled", "launcher_rank", "machine_context", "native_bf16", "omp_wait_policy_set",
           "parse_cpuinfo", "resolve_device", "set_threads", "synchronize"]

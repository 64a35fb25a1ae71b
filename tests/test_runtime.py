"""The runtime: threads and denormals, device choice, CPU capabilities, the dtype policy, the machine context."""
import ast
import json
import os
import pathlib
import subprocess
import sys
import time
import warnings

import pytest
import torch

from attnlab import runtime
from attnlab.errors import AttnlabError
from attnlab.runtime import CpuCapabilities, EmulatedDtypeWarning

AVX2_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz
flags\t\t: fpu vme sse sse2 avx avx2 fma bmi2
"""
AMX_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "attnlab" / "experiments"


def _caps(cpuinfo: str) -> CpuCapabilities:
    model, flags = runtime.parse_cpuinfo(cpuinfo)
    return CpuCapabilities(model=model, capability="AVX2" if "avx512f" not in flags else "AVX512", onednn_bf16=True,
                           avx2="avx2" in flags, avx512f="avx512f" in flags, avx512_bf16="avx512_bf16" in flags,
                           amx_bf16="amx_bf16" in flags, flags_known=True)


@pytest.fixture
def avx2_only(monkeypatch):
    """This process as if it ran on an AVX2 CPU, where bf16 matmuls are emulated (~100x slower than fp32)."""
    monkeypatch.setattr(runtime, "cpu_capabilities", lambda: _caps(AVX2_CPUINFO))


@pytest.fixture
def amx(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_capabilities", lambda: _caps(AMX_CPUINFO))


def test_set_threads_sets_the_count_and_flushes_denormals():
    before, tiny_value = torch.get_num_threads(), torch.tensor([1e-30])
    try:
        torch.set_flush_denormal(False)
        assert (tiny_value * 1e-10).item() != 0.0  # 1e-40 is a denormal float32, and survives
        assert runtime.set_threads(1) == 1 and torch.get_num_threads() == 1
        assert (tiny_value * 1e-10).item() == 0.0  # flushed to zero now
        assert runtime.set_threads(None) == 1  # None keeps the count
    finally:
        torch.set_num_threads(before)
        torch.set_flush_denormal(True)
    with pytest.raises(AttnlabError, match="--threads 0 must be >= 1"):
        runtime.set_threads(0)


def test_resolve_device():
    assert runtime.resolve_device(None) == torch.device("cpu")
    assert runtime.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(AttnlabError, match="'tpu' is not .*choose one of: cpu, cuda"):
        runtime.resolve_device("tpu")
    with pytest.raises(AttnlabError, match="'meta' is not supported"):
        runtime.resolve_device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_an_error_naming_the_fix():
    with pytest.raises(AttnlabError, match="torch sees no CUDA device.*use --device cpu"):
        runtime.resolve_device("cuda")
    assert not runtime.native_bf16("cuda")


def test_cpuinfo_flags_decide_native_bf16():
    assert runtime.parse_cpuinfo(AVX2_CPUINFO) == ("Intel(R) Xeon(R) CPU E5-2690 v4 @ 2.60GHz",
                                                   {"fpu", "vme", "sse", "sse2", "avx", "avx2", "fma", "bmi2"})
    assert runtime.parse_cpuinfo("processor : 0\nFeatures : fp asimd bf16\n") == (None, None)  # ARM: unknown
    assert not _caps(AVX2_CPUINFO).native_bf16 and _caps(AMX_CPUINFO).native_bf16
    unknown = CpuCapabilities("?", "DEFAULT", True, False, False, False, False, flags_known=False)
    assert unknown.native_bf16  # no flags to read: oneDNN's answer decides
    held = CpuCapabilities("?", "AVX512", False, True, True, True, True, flags_known=True)
    assert not held.native_bf16  # AMX in the flags, but oneDNN held below it (ONEDNN_MAX_CPU_ISA) will not use it


def test_bf16_training_where_it_is_native_and_a_step_measures_faster(monkeypatch):
    """No native bf16: never (emulated bf16 runs ~100x slower), and nothing is timed. Native without AMX: the
    step is timed both ways on one thread (the caller's thread count restored), and no step to time means fp32."""
    timed = []
    monkeypatch.setattr(runtime, "native_bf16", lambda device="cpu": False)
    assert runtime.bf16_trains_faster("cpu", make_step=lambda: timed.append) is False and not timed
    monkeypatch.undo()
    monkeypatch.setattr(runtime, "native_bf16", lambda device="cpu": True)
    monkeypatch.setattr(runtime, "cpu_capabilities", lambda: CpuCapabilities("?", "AVX512", True, True, True, True,
                                                                              False, flags_known=True))  # no AMX
    assert runtime.bf16_trains_faster("cpu") is False

    def slow_under_autocast(amp: bool) -> None:  # a step whose bf16 side is clearly dearer
        timed.append((amp, torch.get_num_threads()))
        time.sleep(0.02 if amp else 0.002)
    threads = torch.get_num_threads()
    assert runtime.bf16_trains_faster("cpu", make_step=lambda: slow_under_autocast) is False
    assert {a for a, _ in timed} == {False, True} and {t for _, t in timed} == {1}
    assert torch.get_num_threads() == threads
    assert runtime.faster_under_autocast(lambda amp: time.sleep(0.002 if amp else 0.02)) is True


def test_cpu_capabilities_of_this_machine():
    caps = runtime.cpu_capabilities()
    assert caps.capability == torch.backends.cpu.get_cpu_capability()
    assert caps.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    flags = runtime.parse_cpuinfo(pathlib.Path("/proc/cpuinfo").read_text())[1] or set()
    wide = caps.capability.startswith("AVX512")  # torch not held below the CPU (ATEN_CPU_CAPABILITY)
    assert caps.amx_bf16 == ("amx_bf16" in flags and wide) and caps.avx512_bf16 == ("avx512_bf16" in flags and wide)


def test_an_avx2_only_machine_emulated_by_the_environment():
    """AVX2_ONLY_ENV, set before torch is imported (benchmarks' --as-avx2 re-runs them so), holds torch, oneDNN and
    attnlab's kernels to AVX2: the runtime then sees an AVX2 machine, fp32 the one fast dtype, and records it."""
    flags = runtime.parse_cpuinfo(pathlib.Path("/proc/cpuinfo").read_text())[1] or set()
    if "avx2" not in flags:
        pytest.skip("the CPU has no AVX2 to hold torch to")
    code = ("import json; from attnlab import runtime, kernels; c = runtime.cpu_capabilities(); print(json.dumps(["
            "c.capability, c.native_bf16, c.avx512f, list(runtime.fast_dtypes()), kernels.arch_flags(), "
            "runtime.machine_context()['isa_limits']]))")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **runtime.AVX2_ONLY_ENV}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    capability, native, avx512, fast, arch, limits = json.loads(r.stdout.splitlines()[-1])
    assert capability == "AVX2" and not native and not avx512 and fast == ["fp32"]
    assert limits == runtime.AVX2_ONLY_ENV
    assert arch == (["-march=x86-64-v3", "-mtune=native"] if "avx512f" in flags else ["-march=native"])
    assert runtime.machine_context()["isa_limits"] == {}  # this process: not held


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_an_emulated_dtype_asked_for_warns_and_names_the_fast_choice(avx2_only, dtype):
    with pytest.warns(EmulatedDtypeWarning) as caught:
        message = runtime.check_dtype(dtype, "cpu")
    assert str(caught[0].message) == message
    assert "no native bf16" in message and "use --dtype fp32" in message
    assert "int8 runs bf16 activations too" in message
    assert runtime.fast_dtypes("cpu") == ("fp32",)  # never chosen by default here


def test_native_dtypes_pass_silently(amx):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runtime.check_dtype("bf16", "cpu") is None and runtime.check_dtype("int8", "cpu") is None
        assert runtime.check_dtype("fp32", "cpu") is None
    assert runtime.fast_dtypes("cpu") == ("fp32", "bf16", "int8")
    with pytest.raises(AttnlabError, match="dtype 'fp8' is not supported"):
        runtime.check_dtype("fp8", "cpu")


def test_machine_context_records_where_it_ran():
    ctx = runtime.machine_context(seed=3, dtype="fp32", device="cpu")
    caps = runtime.cpu_capabilities()
    assert ctx["cpu"] == caps.model and ctx["cpu_capability"] == caps.capability
    assert ctx["onednn_bf16"] == caps.onednn_bf16 and ctx["amx"] == caps.amx_bf16
    assert ctx["native_bf16"] == caps.native_bf16 and ctx["device"] == "cpu"
    assert ctx["threads"] == torch.get_num_threads() and ctx["torch"] == torch.__version__ and ctx["seed"] == 3


def test_generate_with_emulated_bf16_warns_on_the_command_line(tmp_path, capsys, monkeypatch):
    from attnlab.cli import main
    from attnlab.config import TrainConfig
    from attnlab.train import train
    from conftest import tiny

    train(tiny(vocab_size=256), TrainConfig(steps=1, batch_size=2, seq_len=16, eval_batches=1), tmp_path / "m",
          progress=False)
    args = ["generate", str(tmp_path / "m"), "--prompt", "def ", "--max-new-tokens", "2", "--json"]
    monkeypatch.setattr(runtime, "cpu_capabilities", lambda: _caps(AVX2_CPUINFO))
    assert main(args + ["--dtype", "bf16"]) == 0
    err = capsys.readouterr().err
    assert "attnlab generate: warning: --dtype bf16: this CPU" in err and "use --dtype fp32" in err
    assert main(args + ["--dtype", "fp32"]) == 0 and "warning" not in capsys.readouterr().err
    monkeypatch.setattr(runtime, "cpu_capabilities", lambda: _caps(AMX_CPUINFO))
    assert main(args + ["--dtype", "bf16"]) == 0 and "warning" not in capsys.readouterr().err


def test_no_experiment_hard_codes_the_cpu():
    """Every experiment runs where `attnlab report --device` says: it uses its device argument (or declares,
    like e01's meta-device trace, where it ran instead) and never names "cpu" itself."""
    for path in sorted(EXPERIMENTS.glob("e[0-9]*.py")):
        source = path.read_text()
        assert '"cpu"' not in source and "'cpu'" not in source, path.name
        run = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "run")
        reads_device = any(isinstance(n, ast.Name) and n.id == "device" and isinstance(n.ctx, ast.Load)
                           for n in ast.walk(run))
        declares = any(isinstance(n, ast.keyword) and n.arg == "device" for n in ast.walk(run))
        assert reads_device or declares, f"{path.name}: run() ignores its device"

"""The cost model: exact parameters, FLOPs equal to what PyTorch counts, KV bytes equal to the real cache."""
import json
import subprocess
import sys
import threading

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config import ModelConfig
from attnlab.cost import Workload, compare, estimate, resolve
from attnlab.cost import hardware
from attnlab.cost.analytic import crossover_tokens, depth, forward_flops, kv_bytes_per_token, params
from attnlab.cost.arch import PRESETS, from_hf_config, from_model_config
from attnlab.cost.trace import trace
from attnlab.errors import ConfigError
from attnlab.models import build_model, count_params

transformers = pytest.importorskip("transformers")


def _hf_param_count(name):
    cfg = PRESETS[name]
    kind = cfg["model_type"]
    cls = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
           "mistral": ("MistralConfig", "MistralForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[kind]
    hf_cfg = getattr(transformers, cls[0])(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = getattr(transformers, cls[1])(hf_cfg)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_counts_equal_hugging_face(name):
    assert params(resolve(name))["total"] == _hf_param_count(name)


def test_published_parameter_counts():
    assert params(resolve("gpt2"))["total"] == 124_439_808
    assert params(resolve("llama-3-8b"))["total"] == 8_030_261_248
    # the model cards' figures (safetensors index totals / 2 bytes): equal to transformers' count above as well
    assert params(resolve("llama-3.1-8b"))["total"] == 8_030_261_248
    assert params(resolve("llama-3.1-70b"))["total"] == 70_553_706_496
    assert params(resolve("llama-3.1-405b"))["total"] == 405_853_388_800
    assert params(resolve("qwen2.5-72b"))["total"] == 72_706_203_648


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=2, mlp="swiglu", norm="rmsnorm", tie_embeddings=False),
                                dict(pos="learned", bias=True), dict(family="lstm"), dict(family="gru")])
def test_parameter_counts_equal_attnlab_models(kw):
    cfg = ModelConfig(dim=64, n_layers=3, n_heads=4, vocab_size=101, max_seq_len=80, **kw)
    assert params(from_model_config(cfg))["total"] == count_params(build_model(cfg))


@pytest.mark.parametrize("T", [8, 33])
@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=2, mlp="swiglu", norm="rmsnorm"), dict(bias=True)])
def test_flops_equal_flop_counter_mode_and_the_tracer(T, kw):
    cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, vocab_size=97, kernel="naive", **kw)
    model = build_model(cfg).eval()
    x = torch.randint(0, 97, (2, T))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    analytic = forward_flops(from_model_config(cfg), T, 0, batch=2, dense=True)["total"]
    assert counter.get_total_flops() == analytic
    assert trace(model, x).flops == analytic


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru"])
def test_recurrent_flops_equal_the_tracer(family):
    cfg = ModelConfig(family=family, dim=48, n_layers=2, vocab_size=50)
    x = torch.randint(0, 50, (1, 20))
    assert trace(build_model(cfg).eval(), x).flops == forward_flops(from_model_config(cfg), 20)["total"]


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=1), dict(n_kv_heads=2, head_dim=24)])
@pytest.mark.parametrize("dtype,torch_dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_kv_bytes_equal_the_real_cache(kw, dtype, torch_dtype):
    cfg = ModelConfig(dim=64, n_layers=3, n_heads=4, **kw)
    state = build_model(cfg).new_state(2, 50, dtype=torch_dtype)
    assert kv_bytes_per_token(from_model_config(cfg), dtype) == state.bytes_per_token
    assert kv_bytes_per_token(from_model_config(cfg), dtype) * 50 * 2 == state.nbytes


def test_rnn_depth_grows_linearly_and_transformer_depth_does_not():
    depths = {}
    for family in ("transformer", "lstm", "gru", "rnn"):
        cfg = ModelConfig(family=family, dim=32, n_layers=2, n_heads=4, max_seq_len=512)
        with torch.device("meta"):
            model = build_model(cfg, device="meta")
        depths[family] = [trace(model, torch.zeros(1, T, dtype=torch.long, device="meta")).depth for T in (32, 64, 128)]
    t = depths["transformer"]
    assert t[0] == t[1] == t[2]
    for family in ("lstm", "gru", "rnn"):
        d = depths[family]
        assert d[2] - d[1] == 2 * (d[1] - d[0]) > 0  # exactly linear in T
        assert d[2] > 10 * t[2]
    a = resolve("gpt2")
    assert depth(a, 100)["depth_steps"] == depth(a, 100_000)["depth_steps"] == 12


def test_crossover_and_growth_factors():
    assert crossover_tokens(resolve("gpt2")) == 8 * 768 - 1
    c = compare(resolve("llama-3-8b"), 8192, 131072)
    assert c["parts"]["attention"]["factor"] == pytest.approx(256, rel=1e-3)
    assert c["parts"]["mlp"]["factor"] == pytest.approx(16)


def test_sliding_window_caps_the_kv_cache():
    mistral = estimate(resolve("mistral-7b"), Workload(16000, 100), hardware.get("h100"))
    llama = estimate(resolve("llama-3-8b"), Workload(8000, 100), hardware.get("h100"))
    assert mistral["kv_cache_bytes"] == mistral["kv_cache_bytes_per_token"] * 4096
    assert llama["kv_cache_bytes"] == llama["kv_cache_bytes_per_token"] * 8100
    assert llama["kv_cache_bytes_per_token"] == 128 * 1024  # 128 KiB/token in bf16 (EVIDENCE.md)
    assert estimate(resolve("llama-2-7b"), Workload(100, 1), hardware.get("h100"))["kv_cache_bytes_per_token"] == 512 * 1024


def test_estimate_fields_and_roofline_regimes():
    e = estimate(resolve("llama-3-8b"), Workload(4096, 256), hardware.get("h100"))
    for key in ("params", "prefill_flops", "decode_flops_per_token", "kv_cache_bytes_per_token", "kv_cache_bytes",
                "attention_mlp_crossover_tokens", "ttft_s", "tpot_s", "memory_bytes", "max_context_tokens"):
        assert key in e
    assert e["prefill_bound"] == "compute" and e["decode_bound"] == "memory"
    assert e["output_over_input_cost"] > 50  # an output token costs far more than an input token


@pytest.mark.parametrize("bad,match", [
    (dict(model_type="llama", hidden_size=64), "lacks vocab_size, num_hidden_layers"),
    (dict(model_type="llama", vocab_size=10, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=3, intermediate_size=8), "n_kv_heads=3 must divide n_heads=4"),
])
def test_bad_configs(bad, match):
    with pytest.raises(ConfigError, match=match):
        from_hf_config(bad)


def test_bad_names_list_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="unknown model 'gpt5'.*llama-3-8b"):
        resolve("gpt5")
    with pytest.raises(ConfigError, match="unknown hardware 'tpu'.*h100-sxm, h200, a100-80gb, rtx-4090, local"):
        hardware.get("tpu")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64}))
    with pytest.raises(ConfigError, match="lacks vocab_size"):
        resolve(str(tmp_path))
    with pytest.raises(ConfigError, match="output_tokens|output-tokens=0 must be > 0"):
        Workload(10, 0)
    with pytest.raises(ConfigError, match="exceeds its context of 1024; pass --allow-beyond-context"):
        estimate(resolve("gpt2"), Workload(1000, 100), hardware.get("h100"))
    assert estimate(resolve("gpt2"), Workload(1000, 100), hardware.get("h100"), allow_beyond_context=True)["ttft_s"] > 0


def test_the_last_output_token_needs_no_context_position():
    """A model with an 8,192-token context reads 8,192 prompt tokens and emits one more: the last output token
    is never fed back, so the check is prompt + output - 1 <= context (8192 + 1 fits, 8192 + 2 does not)."""
    llama = resolve("llama-3-8b")
    assert llama.max_seq_len == 8192
    assert estimate(llama, Workload(8192, 1), hardware.get("h100"))["ttft_s"] > 0
    assert estimate(llama, Workload(8000, 193), hardware.get("h100"))["output_tokens"] == 193
    for prompt, output in ((8192, 2), (8000, 194)):
        with pytest.raises(ConfigError, match="read 8193 positions .*exceeds its context of 8192"):
            estimate(llama, Workload(prompt, output), hardware.get("h100"))
    cli = [sys.executable, "-m", "attnlab", "cost", "llama-3-8b", "--prompt-tokens", "8192", "--json"]
    ok = subprocess.run(cli + ["--output-tokens", "1"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["prompt_tokens"] == 8192, ok.stderr
    refused = subprocess.run(cli + ["--output-tokens", "2"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "exceeds its context of 8192" in refused.stderr


TINY_CALIBRATION = {"widths": (40, 72), "prefill_rows": (12, 36), "decode_rows": (1, 3), "working_sets_mib": (0.1, 0.4),
                    "attention_heads": 2, "attention_tokens": (20, 44), "attention_head_dims": (8, 24),
                    "attention_keys": (12, 52), "elementwise_rows": (1, 12), "floor_width": 16, "cold_mib": (0, 1),
                    "probe": {"dim": 16, "n_heads": 2, "vocab_size": 32, "layers": (1, 3), "batch": (1, 2),
                              "prompt": 6, "new_tokens": 4}}


@pytest.fixture
def tiny_calibration(monkeypatch, tmp_path):
    """The real micro-benchmarks at tiny shapes (seconds), on one thread (on a shared 2-core machine a second
    thread waits for its partner on every tiny kernel), the cache in a temporary folder."""
    from attnlab.cost import calibrate

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(calibrate, "CALIBRATION", TINY_CALIBRATION)
    monkeypatch.setattr(calibrate, "ATTENTION_COLD_BYTES", 2 ** 18)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def test_local_hardware_is_measured_and_cached(tiny_calibration):
    hw = hardware.get("local")
    assert hw.peak_flops["fp32"] > 0 and hw.bandwidth_bytes_per_s > 0 and hw.op_overhead_s >= 0
    assert hw.micro["shapes"] == TINY_CALIBRATION and hw.micro["dtypes"][0] == "fp32"
    cache = json.loads((tiny_calibration / "hardware-local.json").read_text())
    assert all(k.endswith(f"|micro-v{hardware.CALIBRATION_VERSION}") for k in cache["entries"])  # old entries unused
    assert hardware.get("local").peak_flops == hw.peak_flops  # read back from the cache, not re-measured
    # the cost model's CPU prediction runs on what was measured: every part of both phases, finite and >= 0
    from attnlab.cost import cpu
    from attnlab.cost.validate import _case, predict

    pred = predict(_case(48, 2, 2, 10, 2), hw.micro)
    for phase in ("prefill", "decode"):
        assert set(pred[phase]) >= {"overhead", "linear", "attention", "elementwise", "total"}
        assert all(v >= 0 and v < float("inf") for v in pred[phase].values())
        assert pred[phase]["total"] == pytest.approx(sum(v for k, v in pred[phase].items() if k != "total"))
    assert cpu.overheads(hw.micro, "cpu")["decode"]["per_op_s"] >= 0


def test_calibration_shapes_are_disjoint_from_the_validation_cases():
    from attnlab.cost import calibrate
    from attnlab.cost.validate import CASES, _case, case_shapes, check_disjoint

    calibration = calibrate.shapes()
    assert len(calibration) > 50
    for case in CASES:
        assert not case_shapes(case) & calibration, case.name
    check_disjoint(CASES)
    # a case that runs a calibration shape is refused: 48 rows through W = 320 matrices, the prefill table's
    with pytest.raises(ValueError, match="shares shapes with the calibration"):
        check_disjoint([_case(320, 2, 4, 48, 1)])
    with pytest.raises(ValueError, match="shares shapes"):  # the probe model itself
        check_disjoint([_case(16, 1, 2, 100, 1)])


def test_validation_cases_span_the_issue_ranges():
    from attnlab.cost.validate import CASES

    assert len(CASES) >= 8 and len({c.name for c in CASES}) == len(CASES)
    assert min(c.dim for c in CASES) == 128 and max(c.dim for c in CASES) == 1024
    assert min(c.n_layers for c in CASES) == 2 and max(c.n_layers for c in CASES) == 12
    assert min(c.prompt for c in CASES) == 64 and max(c.prompt for c in CASES) == 2048
    assert min(c.batch for c in CASES) == 1 and max(c.batch for c in CASES) == 8
    assert {c.dtype for c in CASES} == {"fp32", "bf16"}


def test_error_arithmetic_and_summary():
    from attnlab.cost.validate import GOAL, summarize

    rows = [{"phase": "prefill", "error": e} for e in (0.10, -0.20, 0.05)] + \
           [{"phase": "decode", "error": e} for e in (-0.30, 0.12)]
    s = summarize(rows)
    assert s["all"] == {"median": pytest.approx(0.12), "worst": pytest.approx(0.30), "n": 5}
    assert s["prefill"]["median"] == pytest.approx(0.10) and s["decode"]["worst"] == pytest.approx(0.30)
    assert s["goal"] == GOAL and s["met"] is True
    assert summarize(rows + [{"phase": "decode", "error": 0.36}])["met"] is False  # worst over 35%
    assert summarize([{"phase": "decode", "error": e} for e in (0.2, -0.2, 0.1)])["met"] is False  # median over 15%


def _synthetic_micro(flops=1e11, stream=1e10, overhead=1e-5):
    """Calibration figures made up so that every rate is one constant: then a prediction is plain arithmetic."""
    from attnlab.cost.calibrate import CALIBRATION, elementwise_elements

    t = lambda s: {"wall": s, "cpu": s, "wall_min": s}  # noqa: E731
    zero = t(0.0)
    lin = {"floor": zero, "prefill": [[w, m, t(24 * m * w * w / flops)] for w in (96, 1280) for m in (48, 1536)],
           "decode": [[w, r, ws, t(12 * w * w * 4 / stream)]
                      for w in (96, 1280) for r in (1, 8) for ws in (2 ** 20, 2 ** 28)]}
    H = CALIBRATION["attention_heads"]
    att = {"floor": {"prefill": zero, "decode": zero},
           "prefill": [[T, D, t(H * 4 * D * T * (T + 1) / 2 / flops)] for T in (96, 1536) for D in (24, 96)],
           "decode": [[S, D, ws, t(H * S * D * 8 / stream)] for S in (40, 4000) for D in (24, 96)
                      for ws in (2 * H * S * D * 4, 2 ** 26)]}
    ew = {"floor": zero, "rows": [[m, w, elementwise_elements(m, w), t(elementwise_elements(m, w) / 1e9)]
                                  for m in (1, 1536) for w in (96, 1280)]}
    def probe_row(layers, ops):
        t = {"ttft": 1e-3 + ops * overhead, "decode": ops * overhead}
        return [layers, 1, {"wall": t, "cpu": t}, {"prefill": ops, "decode": ops}]
    probe = {"rows": [probe_row(1, 40), probe_row(16, 520)]}
    return {"linear": {"fp32": lin}, "attention": att, "elementwise": {"fp32": ew}, "probe": probe,
            "memory": {"touch_bytes": 1e9, "touch": t(0.1), "read_bytes": 1e9, "read": t(0.1)}, "shapes": CALIBRATION}


def test_cpu_prediction_is_the_sum_of_its_parts(monkeypatch):
    """With constant rates the prediction is arithmetic: 2 * M * P_layer / FLOP/s per layer, weight bytes /
    bandwidth, ops * per-op, and so on."""
    from attnlab.cost import cpu
    from attnlab.cost.analytic import params

    micro = _synthetic_micro()
    a = from_model_config(ModelConfig(dim=256, n_layers=4, n_heads=4))
    ops = {"prefill": 150, "decode": 140, "prefill_matmuls": 17, "decode_matmuls": 17}
    P = params(a)["layer_attention"] + params(a)["layer_mlp"]
    pre = cpu.prefill_s(a, 2, 100, micro, "fp32", ops)
    assert pre["overhead"] == pytest.approx(1e-3 + 150 * 1e-5)
    assert pre["linear"] == pytest.approx(4 * 2 * 200 * P / 1e11)
    assert pre["attention"] == pytest.approx(4 * 2 * 4 * 4 * 64 * 100 * 101 / 2 / 1e11)
    assert pre["kv_cache"] == pytest.approx(2 * 4 * 2 * 4 * 101 * 64 * 4 / 1e10)
    dec = cpu.decode_s(a, 2, 300, micro, "fp32", ops)
    assert dec["linear"] == pytest.approx((4 * P + a.vocab_size * a.dim) * 4 / 1e10)
    assert dec["attention"] == pytest.approx(4 * 2 * 4 * 301 * 64 * 8 / 1e10)
    assert dec["overhead"] == pytest.approx(140 * 1e-5, abs=1e-9)
    assert dec["total"] == pytest.approx(sum(v for k, v in dec.items() if k != "total"))
    # bf16 weights: the cache is read at the width set_precision keeps it (bf16 where the decode kernel reads it)
    from attnlab import kernels
    micro["linear"]["bf16"], micro["elementwise"]["bf16"] = micro["linear"]["fp32"], micro["elementwise"]["fp32"]
    monkeypatch.setattr(kernels, "_state", {"native": None})
    assert cpu.decode_s(a, 2, 300, micro, "bf16", ops)["attention"] == pytest.approx(dec["attention"])
    monkeypatch.setattr(kernels, "_state", {"native": object()})
    assert cpu.decode_s(a, 2, 300, micro, "bf16", ops)["attention"] == pytest.approx(dec["attention"] / 2)


def test_validate_produces_the_table_and_the_summary(monkeypatch, tmp_path, capsys):
    """The whole --validate path on made-up figures (no timing): calibrations around the cases, one row per case
    and phase with error = predicted / measured - 1, the pace scaling, the summary, the JSON file and the table."""
    from argparse import Namespace

    from attnlab.cli_measure import _cost_validate
    from attnlab.cost import validate as v

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    even = {"fp32": 1e-3, "memory": 1e-2, "dispatch": 1e-4}
    micro = {**_synthetic_micro(), "seconds": 0.0, "dtypes": ["fp32"], "pulse": {"wall": even, "cpu": even}}
    monkeypatch.setattr(hardware, "calibrate", lambda dtypes=None, modules=None: hardware.Hardware(
        "local", {"fp32": 1e11}, 1e10, 1e10, 1e-5, "test", micro=micro))
    cases = (v._case(128, 2, 4, 64, 1), v._case(256, 3, 4, 100, 2), v._case(128, 2, 4, 64, 1, "bf16"))
    monkeypatch.setattr(v, "CASES", cases)
    monkeypatch.setattr("attnlab.runtime.fast_dtypes", lambda device="cpu": ("fp32",))
    slow_fp32 = {**even, "fp32": 2e-3}  # matrix arithmetic ran at half the calibration's pace beside the cases
    measured = {"wall": {"ttft": 0.02, "decode": 0.004}, "cpu": {"ttft": 0.01, "decode": 0.002},
                "spread": {"ttft_min": 0.01, "ttft_max": 0.01, "decode_min": 0.002, "decode_max": 0.002},
                "pulse": {"wall": slow_fp32, "cpu": slow_fp32}}
    monkeypatch.setattr(v, "_measure_in_child", lambda case, repeats, threads: measured)
    monkeypatch.setattr(v, "GROUP", 1)
    out = tmp_path / "res.json"
    assert _cost_validate(Namespace(threads=1, out=str(out), json=False)) == 0
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 4 and res["clock"] == "cpu" and len(res["calibrations"]) == 3  # groups of one case
    assert [s["case"] for s in res["skipped"]] == ["d128-L2-T64-B1-bf16"]  # bf16 is "emulated" here
    for r in res["rows"]:
        assert r["measured_s"] == measured["cpu"]["ttft" if r["phase"] == "prefill" else "decode"]
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert r["pace"][0] == {"fp32": 2.0, "memory": 1.0, "dispatch": 1.0}
        if r["phase"] == "prefill":  # linear, attention and elementwise doubled; overhead and memory parts not
            p = r["parts"]
            assert r["predicted_s"] == pytest.approx(r["predicted_unpaced_s"] + (p["linear"] + p["attention"]
                                                                                 + p["elementwise"]) / 2)
    assert res["summary"]["all"]["n"] == 4
    assert "predicted" in text and "d256-L3-T100-B2-fp32" in text and "goal median <= 15%" in text
    assert "skipped d128-L2-T64-B1-bf16" in text and "W x 3W" in text
    assert res["context"]["cpu_capability"] and "onednn_bf16" in res["context"]
    assert _cost_validate(Namespace(threads=1, out=str(out), json=True)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["all"]["n"] == 4 and len(printed["rows"]) == 4
    from attnlab.cost.calibrate import CALIBRATION
    assert printed["calibration_shapes"]["widths"] == list(CALIBRATION["widths"])


def test_elementwise_passes_follow_the_layer_formulas():
    from attnlab.cost.analytic import forward_elementwise

    a = resolve("gpt2")  # learned positions, GELU, 12 heads of 64
    T, L, d, F, H = 256, 12, 768, 3072, 12
    e = forward_elementwise(a, T, 0, sampled_rows=1)
    assert e["norms"] == L * 2 * T * d + T * d and e["residuals"] == L * 2 * T * d
    assert e["activation"] == L * T * F and e["softmax"] == L * H * T * (T + 1) // 2
    assert "rotary" not in e and e["sampling"] == 2 * 50257
    llama = forward_elementwise(resolve("llama-3-8b"), T)
    assert llama["activation"] == 32 * 3 * T * 14336 and llama["rotary"] == 32 * 5 * T * (4096 + 1024)
    decode = forward_elementwise(a, 1, 1000)
    assert decode["softmax"] == L * H * 1001  # one query scores every cached key and itself
    # on a measured (CPU) spec the passes cost time; on a datasheet GPU they are part of the memory traffic
    from attnlab.cost.analytic import roofline_s

    cpu = hardware.Hardware("cpu", {"fp32": 1e11}, 2e10, 1e10, 0.0, "measured", {"64": 1e11}, 2e10, 1e9)
    assert roofline_s(0, 0, cpu, "fp32", elements=1e9) == pytest.approx(1.0)
    assert roofline_s(0, 0, hardware.get("h100"), "fp32", elements=1e9) == 0.0


# ---- across devices (cost.parallel) ------------------------------------------------------------------------------
def test_devices_split_memory_and_price_communication():
    from attnlab.cost.parallel import allreduce_s, devices_to_prefill, estimate_devices, fewest_devices

    hw, nv, ib = hardware.get("h100"), hardware.interconnect(None, "h100-sxm"), hardware.interconnect("infiniband-ndr", "h100")
    a, w = resolve("llama-3-70b"), Workload(7000, 256)
    one = estimate(a, w, hw)
    assert one["memory_bytes"] > hw.memory_bytes  # the case that used to stop at "0 tokens"
    assert allreduce_s(1e9, 1, nv) == 0 and allreduce_s(1e9, 2, nv) == pytest.approx(1e9 / nv.bandwidth_bytes_per_s + 2 * nv.latency_s)
    tp = estimate_devices(a, w, hw, nv, ib, tensor=8)
    mem = tp["memory_per_device_bytes"]
    assert mem["weights"] == pytest.approx(one["weight_bytes"] / 8) and mem["kv_cache"] == pytest.approx(one["kv_cache_bytes"] / 8)
    assert tp["comm_s"]["tensor_prefill"] > 0 and tp["ttft_s"] < one["ttft_s"] and tp["tpot_s"] < one["tpot_s"]
    sp = estimate_devices(a, w, hw, nv, ib, sequence=4)
    assert sp["memory_per_device_bytes"]["weights"] == one["weight_bytes"]  # replicated
    assert sp["comm_s"]["sequence_prefill_total"] > 0
    pp = estimate_devices(a, w, hw, nv, ib, pipeline=4)
    assert pp["ttft_s"] >= one["ttft_s"]  # one request passes every stage in turn
    assert fewest_devices(a, w, hw, nv, ib, "tensor")["devices"] == 2
    assert fewest_devices(a, w, hw, nv, ib, "sequence") is None  # 141 GB of weights on every device
    assert fewest_devices(resolve("llama-3.1-8b"), Workload(131000, 1), hw, nv, ib, "sequence")["devices"] >= 1
    million = devices_to_prefill(resolve("llama-3.1-70b"), 1_000_000, 60.0, hw, nv, ib)
    assert million["fits"] and million["ttft_s"] <= 60 and million["devices"] == million["tensor"] * million["sequence"]
    # a million tokens' prefill is at least its FLOPs over the devices' peak
    flops = forward_flops(resolve("llama-3.1-70b"), 1_000_000, 0, head_rows=1)["total"]
    assert million["ttft_s"] >= flops / (million["devices"] * hw.flops("bf16"))


def test_cost_cli_answers_with_devices(capsys):
    from attnlab.cli import main

    assert main(["cost", "llama-3-70b", "--prompt-tokens", "7000", "--hardware", "h100"]) == 0
    out = capsys.readouterr().out
    assert "cannot hold it alone" in out and "tensor   : 2 devices" in out and "prefill of 1,000,000 tokens" in out
    assert main(["cost", "llama-3.1-405b", "--prompt-tokens", "100000", "--devices", "16", "--parallel", "tensor",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["multi_device"]["requested"]
    assert res["devices"] == 16 and res["links"]["tensor"] == "nvlink4"


def test_stamped_generation_times_decode_apart_from_the_prefill():
    """The decode figure comes from the steps after the first token (both clocks), so a long prompt's prefill
    does not enter it: with the same steps, a 16x longer prompt raises TTFT far more than the decode figure
    (measured: TTFT 3.1x, decode 1.2x)."""
    from attnlab.cost.engine_timing import stamped_generate, time_generate
    from attnlab.engine import generate

    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, vocab_size=64, max_seq_len=1100)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.inference_mode():
        short, long_ = [[1] * 64], [[1] * 1024]
        one = stamped_generate(model, short, 9)
        assert set(one) == {"wall", "cpu"} and all(t > 0 for c in one.values() for t in c)
        timed = {name: time_generate(model, p, 9, repeats=3, min_warm_s=0.0) for name, p in (("short", short),
                                                                                             ("long", long_))}
        assert set(timed["short"]["spread"]) == {"ttft_min", "ttft_max", "decode_min", "decode_max"}
        ttft_ratio = timed["long"]["wall"]["ttft"] / timed["short"]["wall"]["ttft"]
        decode_ratio = timed["long"]["wall"]["decode"] / timed["short"]["wall"]["decode"]
        assert ttft_ratio > 2 and decode_ratio < 0.6 * ttft_ratio, (ttft_ratio, decode_ratio)
        # it generates what engine.generate does (the same scheduler, greedy by default)
        assert len(generate(model, short, 9).tokens) == 9
        # the first token is timed after a prefill-only step: a full step also takes a just-prefilled row's second
        from attnlab.engine.sampling import SamplingParams
        from attnlab.engine.scheduler import Scheduler, Sequence
        for decode, want in ((False, 1), (True, 2)):
            sched = Scheduler(model, max_len=80, max_batch=2)
            seqs = [sched.submit(Sequence([1] * n, 9, SamplingParams())) for n in (64, 40)]
            sched.step(decode=decode)
            assert [len(s.tokens) for s in seqs] == [want, want]


def test_a_cancelled_calibration_stops_and_caches_nothing(monkeypatch, tmp_path):
    """``cancel`` (a server's shutdown) stops the micro-benchmarks before their next timed repeat; no spec is saved,
    and the next calibration on the same thread is not stopped by the old event."""
    from attnlab.cost import calibrate

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    stop = threading.Event()
    stop.set()
    with pytest.raises(calibrate.Cancelled):
        hardware.local(cancel=stop)
    assert not (tmp_path / "hardware-local.json").exists()
    assert calibrate._time(lambda: None, repeats=1, warm=0)["wall"] >= 0  # the thread's cancel event was reset


"""The cost model: exact parameters, FLOPs equal to what PyTorch counts, KV bytes equal to the real cache."""
import json
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.config import ModelConfig
from attnlab.cost import Workload, compare, estimate
from attnlab.cost import hardware
from attnlab.cost.analytic import crossover_tokens, depth, forward_flops, kv_bytes_per_token, params
from attnlab.cost.arch import PUBLISHED, from_hf_config, from_model_config
from attnlab.resolve import architecture as resolve
from attnlab.measure.trace import trace
from attnlab.errors import ConfigError
from attnlab.models import build_model, count_params

transformers = pytest.importorskip("transformers")


def _hf_param_count(name):
    cfg = PUBLISHED[name]
    kind = cfg["model_type"]
    cls = {"gpt2": ("GPT2Config", "GPT2LMHeadModel"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
           "mistral": ("MistralConfig", "MistralForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}[kind]
    hf_cfg = getattr(transformers, cls[0])(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = getattr(transformers, cls[1])(hf_cfg)
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("name", list(PUBLISHED))
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
                                dict(pos="learned", bias=True), dict(family="lstm"), dict(family="gru"),
                                dict(family="linear", pos="none"), dict(family="ssm", pos="none"),
                                dict(family="ssm", pos="none", short_conv=0, ssm_gate_bias=None)])
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


def test_a_fused_recurrent_kernel_counts_its_internal_steps():
    """torch's fused LSTM dispatches one op per layer on the CPU (oneDNN); its T dependent steps per layer still count,
    so its depth grows like the visible loop's and the claim that a recurrence has O(n) depth can fail."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="lstm", fused=True, dim=16, n_layers=2, n_heads=4, max_seq_len=64)).eval()
    runs = [trace(model, torch.zeros(1, T, dtype=torch.long)) for T in (8, 16, 32)]
    d = [r.depth for r in runs]
    assert d[2] - d[1] == 2 * (d[1] - d[0]) > 0 and d[0] >= 2 * 8  # linear in T, at least T steps a layer
    if runs[0].ops_by_name.get("mkldnn_rnn_layer"):  # the fused kernel ran as one op a layer: its steps were counted
        assert [r.recurrent_steps for r in runs] == [2 * 8, 2 * 16, 2 * 32]
    lstm = torch.nn.LSTM(4, 4, num_layers=3)  # time-major input, 3 layers in one module
    assert trace(lstm, torch.zeros(5, 1, 4)).depth >= 3 * 5


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

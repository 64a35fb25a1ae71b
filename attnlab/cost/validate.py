"""Check the cost model against the engine: predicted vs measured prefill and decode times, here.

For each config the model is built, its prefill (time-to-first-token) and decode (time per output
token) are timed with attnlab's engine, and the analytic roofline on the ``local`` calibrated spec
predicts both. The number of dispatched ops per forward, which sets the fixed overhead that
dominates small models, is counted by the tracer on the real model (a structural count, not a
timing). Relative error = predicted / measured - 1.
"""
from __future__ import annotations

import statistics

import torch

from attnlab.config import ModelConfig, preset
from attnlab.cost import hardware
from attnlab.cost.analytic import forward_bytes, forward_flops, roofline_s, typical_matmul_size
from attnlab.cost.arch import from_model_config
from attnlab.cost.trace import trace

CONFIGS = {"mini-1.3m": preset("default", dim=160, n_heads=5), "small-10m": preset("small-10m"),
           "gpt2-124m": preset("gpt2")}


def _predict(cfg: ModelConfig, prompt: int, ctx: int, hw) -> dict:
    from attnlab.models import build_model

    a = from_model_config(cfg)
    with torch.device("meta"):
        meta = build_model(cfg, device="meta")
    prefill_ops = trace(meta, torch.zeros(1, prompt, dtype=torch.long, device="meta")).ops + hardware.SAMPLING_OPS
    state = meta.new_state(1, ctx + 1)
    state.pos = ctx
    decode_ops = trace(meta, torch.zeros(1, 1, dtype=torch.long, device="meta"), state).ops + hardware.SAMPLING_OPS
    pre = roofline_s(forward_flops(a, prompt, 0, head_rows=1)["total"],
                     forward_bytes(a, prompt, 0, 1, "fp32", head_rows=1)["total"], hw, "fp32", prefill_ops,
                     typical_matmul_size(a, prompt))
    dec = roofline_s(forward_flops(a, 1, ctx)["total"], forward_bytes(a, 1, ctx, 1, "fp32")["total"], hw, "fp32",
                     decode_ops)
    return {"prefill": pre, "decode": dec, "ops": {"prefill": prefill_ops, "decode": decode_ops}}


def validate(configs: dict[str, ModelConfig] | None = None, prompt: int = 256, new_tokens: int = 32,
             repeats: int = 5, refresh: bool = False) -> list[dict]:
    from attnlab.engine import generate
    from attnlab.engine.quantize import set_precision
    from attnlab.models import build_model, count_params

    hw = hardware.get("local", refresh=refresh)
    rows = []
    for name, cfg in (configs or CONFIGS).items():
        model = build_model(cfg)
        n_params = count_params(model)
        model = set_precision(model, "fp32")
        ids = torch.randint(0, cfg.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
        for _ in range(3):  # warm-up: thread pools, allocator, first-touch of the weights
            generate(model, ids, 4)
        ttft, tpot = [], []
        for _ in range(repeats):
            st = generate(model, ids, new_tokens).stats
            ttft.append(st.ttft_s)
            tpot.append(st.tpot_s)
        pred = _predict(cfg, prompt, prompt + new_tokens // 2, hw)
        for phase, measured in (("prefill", statistics.median(ttft)), ("decode", statistics.median(tpot))):
            rows.append({"model": name, "params": n_params, "phase": phase, "tokens": prompt if phase == "prefill" else 1,
                         "predicted_s": pred[phase], "measured_s": measured, "error": pred[phase] / measured - 1,
                         "ops": pred["ops"][phase], "hardware": hw.to_dict()})
    return rows

"""The calibration's attention tables (calibrate.py runs them): the engine's causal prefill attention over T tokens
and its compiled decode attention of one query over S cached keys, hot and over distinct caches."""
from __future__ import annotations

import torch

from attnlab.measure.micro import CALIBRATION, MiB, floor_timed, timed

ATTENTION_COLD_BYTES = 64 * MiB  # decode attention is also timed over distinct caches adding up to this


def _sdpa(B: int, H: int, T: int, S: int, D: int, dtype, copies: int = 1) -> callable:
    """One call of the engine's ``sdpa`` kernel (causal when T == S; attnlab's compiled prefill attention where it
    applies, as in the engine's prefill, else torch's SDPA), or ``copies`` calls over distinct keys and values in
    turn (a decode step reads every layer's cache: from DRAM once they outgrow the caches)."""
    from attnlab.models.attention import sdpa_attention

    q = torch.randn(B, H, T, D, dtype=dtype)
    kvs = [(torch.randn(B, H, S, D, dtype=dtype), torch.randn(B, H, S, D, dtype=dtype)) for _ in range(copies)]
    causal = T == S and T > 1

    def fn():
        with torch.no_grad():
            for k, v in kvs:
                sdpa_attention(q, k, v, causal=causal, alibi_slopes=None, scale=D ** -0.5)
    return fn


def _decode_attention(H: int, S: int, D: int, copies: int = 1) -> callable:
    """One query over S cached fp32 keys, or ``copies`` calls over distinct caches in turn, through the kernel the
    engine's decode steps use: attnlab's compiled decode attention (kernels/decode_attention.cpp, which the block
    step calls) where it is built, else SDPA."""
    from attnlab import kernels

    mod = kernels.native()
    if mod is None:
        return _sdpa(1, H, 1, S, D, torch.float32, copies)
    q = torch.randn(1, H, D)
    kvs = [(torch.randn(1, H, S, D), torch.randn(1, H, S, D)) for _ in range(copies)]
    lens, none = torch.tensor([S]), torch.empty(0, dtype=torch.long)

    def fn():
        for k, v in kvs:
            mod.decode_attention(q, k, v, *k.stride()[:3], none, 0, lens, H, D ** -0.5)
    return fn


def attention_tables(dtypes: tuple[str, ...] = ("fp32",)) -> dict:
    """{"prefill": {dtype: [[T, D, s]]}, "decode": [[S, D, bytes cycled, s per call]], "floor": {"prefill": {dtype:
    s}, "decode": s}} for CALIBRATION's head count, batch 1. Prefill in fp32, and in bf16 where ``dtypes`` has bf16
    or int8 (their prefill attends in the cache's bf16 where attnlab's kernels are built: cpu.attention_dtype; bf16
    SDPA runs at its own pace, much slower than fp32's where a CPU lacks bf16 matrix units). Decode with an fp32 cache (a bf16 cache is predicted
    at the same bytes/s: cpu.decode_s counts its bytes). Prefill is the engine's causal ``sdpa`` kernel (_sdpa);
    decode is the engine's
    decode kernel (_decode_attention), timed over one cache (from the CPU's caches) and over distinct caches adding
    up to 64 MiB (DRAM; at most 200 of them: the smallest stay within the caches, as a small model's do)."""
    H = CALIBRATION["attention_heads"]
    f32 = torch.float32
    decode = []
    for S in CALIBRATION["attention_keys"]:
        for D in CALIBRATION["attention_head_dims"]:
            per = 2 * H * S * D * 4
            for copies in sorted({1, min(max(1, round(ATTENTION_COLD_BYTES / per)), 200)}):
                t = timed(_decode_attention(H, S, D, copies), repeats=5, inner=max(1, 10 // copies))
                decode.append([S, D, copies * per, {k: v / copies for k, v in t.items()}])
    kinds = {"fp32": f32, **({"bf16": torch.bfloat16} if {"bf16", "int8"} & set(dtypes) else {})}
    return {"prefill": {k: [[T, D, timed(_sdpa(1, H, T, T, D, dt), repeats=5)]
                            for T in CALIBRATION["attention_tokens"] for D in CALIBRATION["attention_head_dims"]]
                        for k, dt in kinds.items()},
            "decode": decode,
            "floor": {"prefill": {k: floor_timed(_sdpa(1, H, 8, 8, 8, dt)) for k, dt in kinds.items()},
                      "decode": floor_timed(_decode_attention(H, 8, 8), inner=50)}}

"""The analytic cost model: parameters, FLOPs, bytes, KV cache, memory, depth and roofline latency.

Conventions (each formula below states its own):
- a matmul of (m x k) by (k x n) costs 2*m*k*n FLOPs; norms, activations, softmax and rotary are not
  counted (they are O(T*d), small beside the matmuls, and FlopCounterMode does not count them either);
- attention is causal: query i scores min(i+1, window) keys ("useful" work). ``dense=True`` counts the
  full T x S rectangle instead, which is what the naive kernel and torch's FLOP counter count;
- prefill computes the LM head for the last position only (what generation needs); a training step
  computes it for every position and costs 3x the forward (backward = 2x forward);
- bytes: every weight is read once per forward pass (the embedding table only for the rows used), the
  KV cache is written once per new token and read whole by every query block, activations are each
  matmul's input read plus output written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from attnlab.cost.arch import Arch
from attnlab.errors import ConfigError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype {dtype!r} is not known; choose one of: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def layer_params(a: Arch) -> dict:
    """Per-layer parameter counts: attention = d*(H+2Hkv)*D + H*D*d (+ biases); MLP = 2*d*F (gelu) or 3*d*F.
    SSM mixer (no MLP): in 2*d*E, dt d*R/16.. (E*R + R*E + E), B/C 2*E*N, A E*N, D E, out E*d, gate bias E. A short
    convolution of width w over C channels (linear: C = 3*H*D, SSM: C = E) adds C*(w + 1)."""
    if a.family == "ssm":
        E, N, R = a.ssm_expand * a.dim, a.ssm_state, max(1, math.ceil(a.dim / 16))
        mixer = (2 * a.dim * E + E * R + R * E + E + 2 * E * N + E * N + E + E * a.dim + E * a.ssm_gate_bias
                 + conv_channels(a) * (a.short_conv + 1))
        return {"attention": mixer, "mlp": 0, "norms": a.dim * (2 if a.norm_bias else 1)}
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    if a.family == "linear":
        kv = q  # no grouped heads in linear attention
    attn = a.dim * (q + 2 * kv) + q * a.dim + (q + 2 * kv) * a.qkv_bias + a.dim * a.out_bias
    attn += conv_channels(a) * (a.short_conv + 1)
    mats = 3 if a.mlp == "swiglu" else 2
    mlp = mats * a.dim * a.hidden_dim + a.mlp_bias * ((mats - 1) * a.hidden_dim + a.dim)
    norms = 2 * a.dim * (2 if a.norm_bias else 1)
    return {"attention": attn, "mlp": mlp, "norms": norms}


def conv_channels(a: Arch) -> int:
    """Channels of the short convolution (0 without one): the SSM's inner width E, linear attention's q, k, v."""
    if not a.short_conv or a.family not in ("linear", "ssm"):
        return 0
    return a.ssm_expand * a.dim if a.family == "ssm" else 3 * a.n_heads * a.head_dim


def params(a: Arch) -> dict:
    """Exact parameter count: V*d embedding (+ max_seq_len*d learned positions) + L layers + final norm + head."""
    if a.family in ("rnn", "lstm", "gru"):
        gates = {"rnn": 1, "lstm": 4, "gru": 3}[a.family]
        rnn = a.n_layers * gates * (2 * a.dim * a.dim + 2 * a.dim)
        total = a.vocab_size * a.dim * (1 if a.tie_embeddings else 2) + rnn + 2 * a.dim
        return {"total": total, "embedding": a.vocab_size * a.dim, "recurrent": rnn}
    lp = layer_params(a)
    emb = a.vocab_size * a.dim + (a.max_seq_len * a.dim if a.pos == "learned" else 0)
    head = 0 if a.tie_embeddings else a.vocab_size * a.dim
    final_norm = a.dim * (2 if a.norm_bias else 1)
    per_layer = sum(lp.values())
    return {"total": emb + a.n_layers * per_layer + final_norm + head, "embedding": emb, "head": head,
            "per_layer": per_layer, "layers": a.n_layers * per_layer, **{f"layer_{k}": v for k, v in lp.items()}}


def attended_keys(T: int, S: int, window: int | None, dense: bool, block: int | None = None) -> int:
    """Sum over T new queries (after S cached tokens) of the keys each scores."""
    if dense:
        return T * (S + T)
    if block:  # local + strided pattern: (i mod b) + 1 local keys and i // b summary keys
        return sum((i % block) + 1 + i // block for i in range(S, S + T))
    if window is None:
        return T * S + T * (T + 1) // 2
    return sum(min(S + i + 1, window) for i in range(T)) if T < 100_000 else int(
        T * min(window, S + (T + 1) / 2))


def forward_flops(a: Arch, T: int, S: int = 0, batch: int = 1, head_rows: int | None = None,
                  dense: bool = False) -> dict:
    """FLOPs of one forward over T new tokens after S cached ones, by part:
    projections 2*T*d*(H+2Hkv)*D + 2*T*H*D*d; attention 4*H*D*keys (QK^T and AV); MLP 2*T*(2 or 3)*d*F;
    LM head 2*rows*d*V (rows = T, or head_rows); a short convolution 2*T*C*w (conv_channels)."""
    if a.family in ("rnn", "lstm", "gru"):  # input and hidden matmuls per gate, every step; then the head
        gates = {"rnn": 1, "lstm": 4, "gru": 3}[a.family]
        parts = {"recurrent": a.n_layers * 2 * 2 * T * gates * a.dim * a.dim,
                 "lm_head": 2 * (T if head_rows is None else head_rows) * a.dim * a.vocab_size}
        parts = {k: v * batch for k, v in parts.items()}
        parts["total"] = sum(parts.values())
        return parts
    if a.family == "ssm":
        E, N, R = a.ssm_expand * a.dim, a.ssm_state, max(1, math.ceil(a.dim / 16))
        parts = {"projections": a.n_layers * 2 * T * (2 * a.dim * E + 2 * E * R + 2 * E * N + E * a.dim
                                                      + conv_channels(a) * a.short_conv),
                 "scan": a.n_layers * T * E * N * (6 if a.scan == "sequential" else 3 * max(1, math.ceil(math.log2(max(T, 2))))),
                 "lm_head": 2 * (T if head_rows is None else head_rows) * a.dim * a.vocab_size}
        parts = {k: v * batch for k, v in parts.items()}
        parts["total"] = sum(parts.values())
        return parts
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    L = a.n_layers
    if a.family == "linear":  # chunked: C x C within chunks, D x D state products; no keys to score
        C, D = min(a.chunk_size, T), a.head_dim
        parts = {"qkv_out_projections": L * (2 * T * a.dim * 3 * q + 2 * T * q * a.dim
                                             + 2 * T * conv_channels(a) * a.short_conv),
                 "attention": L * a.n_heads * (4 * T * C * D + 4 * T * D * D),
                 "mlp": L * 2 * T * a.dim * a.hidden_dim * (3 if a.mlp == "swiglu" else 2),
                 "lm_head": 2 * (T if head_rows is None else head_rows) * a.dim * a.vocab_size}
        parts = {k: v * batch for k, v in parts.items()}
        parts["total"] = sum(parts.values())
        return parts
    keys = attended_keys(T, S, a.sliding_window, dense, a.block_size)
    parts = {
        "qkv_out_projections": L * (2 * T * a.dim * (q + 2 * kv) + 2 * T * q * a.dim),
        "attention": L * 4 * a.n_heads * a.head_dim * keys,
        "mlp": L * 2 * T * a.dim * a.hidden_dim * (3 if a.mlp == "swiglu" else 2),
        "lm_head": 2 * (T if head_rows is None else head_rows) * a.dim * a.vocab_size,
    }
    parts = {k: v * batch for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def forward_elementwise(a: Arch, T: int, S: int = 0, batch: int = 1, sampled_rows: int = 0) -> dict:
    """Elements passed through non-matmul kernels in one forward over T new tokens after S cached ones, each
    counted once per kernel pass (what a CPU pays per element whatever the FLOP count; a GPU hides it in the
    memory traffic). Transformer, per layer: two norms 2*T*d; two residual adds 2*T*d; rotary 5*T*(q + kv)
    (half-split, negate, concatenate, multiply, multiply-add); softmax H*keys (the exponentials of the scores;
    + H*keys for an ALiBi bias); activation T*F (GELU) or 3*T*F (SiLU, gate product). Recurrent: the gate
    nonlinearities and state updates, (2 + 3*gates)*T*d per layer; SSM: the scan's elementwise updates
    4*T*E*N + norms and gates (T*E more with the gate's bias); linear attention: the feature map and normaliser,
    4*T*(q + kv) + norms + MLP;
    either with a short convolution: its SiLU, T*C (conv_channels). Sampling a token from a row of logits (argmax or draw, and the log-sum-exp for its log-probability): 2*V
    per sampled row. Narrow models spend a large share of a CPU prefill here."""
    d, L = a.dim, a.n_layers
    if a.family in ("rnn", "lstm", "gru"):
        gates = {"rnn": 1, "lstm": 4, "gru": 3}[a.family]
        parts = {"recurrent": L * T * d * (2 + 3 * gates)}
    elif a.family == "ssm":
        E, N = a.ssm_expand * d, a.ssm_state
        parts = {"scan": L * T * 4 * E * N, "norms_gates": L * T * (2 * d + 3 * E + E * a.ssm_gate_bias)}
    else:
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        act = T * a.hidden_dim * (3 if a.mlp == "swiglu" else 1)
        parts = {"norms": L * 2 * T * d + T * d, "residuals": L * 2 * T * d, "activation": L * act}
        if a.family == "linear":
            parts["feature_map"] = L * 4 * T * (q + kv)
        else:
            keys = attended_keys(T, S, a.sliding_window, False, a.block_size)
            parts["softmax"] = L * a.n_heads * keys * (2 if a.pos == "alibi" else 1)
            if a.pos == "rope":
                parts["rotary"] = L * 5 * T * (q + kv)
    if conv_channels(a):
        parts["short_conv"] = L * T * conv_channels(a)
    parts["sampling"] = 2 * sampled_rows * a.vocab_size
    parts = {k: v * batch for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def kv_bytes_per_token(a: Arch, dtype: str = "bf16") -> int:
    """2 (K and V) * L * Hkv * D * bytes per element (0 for fixed-state families: their state does not grow)."""
    if a.family != "transformer":
        return 0
    return 2 * a.n_layers * a.n_kv_heads * a.head_dim * dtype_bytes(dtype)


def kv_cache_bytes(a: Arch, tokens: int, batch: int = 1, dtype: str = "bf16") -> int:
    """Per-token bytes times the tokens held: a sliding window holds at most `window` positions."""
    held = min(tokens, a.sliding_window) if a.sliding_window else tokens
    return kv_bytes_per_token(a, dtype) * held * batch


def weight_bytes(a: Arch, dtype: str = "bf16") -> int:
    return params(a)["total"] * dtype_bytes(dtype)


def forward_bytes(a: Arch, T: int, S: int, batch: int, dtype: str, head_rows: int | None = None) -> dict:
    """Bytes moved by one forward: weights once (embedding: T rows), KV read + write, activations."""
    b = dtype_bytes(dtype)
    p = params(a)
    weights = (p["total"] - p["embedding"]) * b + T * batch * a.dim * b
    if a.tie_embeddings:
        weights += a.vocab_size * a.dim * b  # the head reads the shared matrix whole
    held = min(S + T, a.sliding_window) if a.sliding_window else S + T
    kv_read = kv_bytes_per_token(a, dtype) * held * batch
    kv_write = kv_bytes_per_token(a, dtype) * T * batch
    q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
    per_token_act = a.n_layers * (2 * a.dim + (q + 2 * kv) + 2 * q + 2 * a.dim + a.dim
                                  + a.hidden_dim * (3 if a.mlp == "swiglu" else 2) + a.dim)
    rows = T if head_rows is None else head_rows
    act = (per_token_act * T + rows * (a.dim + a.vocab_size)) * batch * b
    return {"weights": weights, "kv_read": kv_read, "kv_write": kv_write, "activations": act,
            "total": weights + kv_read + kv_write + act}


def crossover_tokens(a: Arch) -> float:
    """Prompt length T at which causal attention FLOPs (4*H*D*T(T+1)/2 per layer) equal the MLP's
    (2*T*(2|3)*d*F): T = (2|3)*d*F / (H*D) - 1. For GPT-2 small 8*d - 1 = 6143."""
    mats = 3 if a.mlp == "swiglu" else 2
    return mats * a.dim * a.hidden_dim / (a.n_heads * a.head_dim) - 1


@dataclass
class Workload:
    prompt_tokens: int
    output_tokens: int
    batch: int = 1
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens", "batch"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.replace('_', '-')}={getattr(self, name)} must be > 0")
        dtype_bytes(self.dtype)


def roofline_s(flops: float, nbytes: float, hw, dtype: str, n_ops: int = 0, matmul_size: float | None = None,
               elements: float = 0.0) -> float:
    """Datasheet spec: max(FLOPs / peak, bytes / bandwidth) + n_ops * launch overhead (a GPU overlaps compute
    and memory traffic across thousands of threads; elementwise work is part of its memory traffic).
    Measured spec (a CPU): FLOPs / achievable FLOP/s + bytes / streaming bandwidth + elementwise passes /
    measured elements per second + n_ops * dispatch cost, summed, because the ops run one after another and
    each is limited by one or the other; the FLOP/s are those of a matmul of ``matmul_size`` (small matrices
    run far below peak), the bandwidth is what matrix-vector products achieve (from cache when the bytes fit in
    half the last-level cache, else from DRAM), and ``elements`` counts the
    non-matmul passes (``forward_elementwise``: norms, softmax, activations, rotary)."""
    compute = flops / hw.flops(dtype, matmul_size)
    memory = nbytes / hw.stream_bandwidth(nbytes, matmul_size)
    if hw.flops_by_size is None:
        return max(compute, memory) + n_ops * hw.op_overhead_s
    rate = getattr(hw, "elementwise_per_s", None)
    return compute + memory + (elements / rate if rate else 0.0) + n_ops * hw.op_overhead_s


def typical_matmul_size(a: Arch, T: int) -> float:
    """The width that sets a layer's matmul efficiency: the model dimension d (inner size of every projection)."""
    return a.dim


OPS_PER_LAYER = 24  # dispatched kernels per transformer layer in a forward (attnlab's, counted by the tracer)


def depth(a: Arch, T: int, scan: str = "sequential") -> dict:
    """Critical path in dependent steps (a step = one layer's work on one position, or one matmul chain):
    transformer L (every position in parallel; T does not appear); RNN/LSTM/GRU T + L - 1 (a wavefront:
    step (l, t) needs (l-1, t) and (l, t-1)); SSM sequential scan T * L, parallel scan L * ceil(log2 T)."""
    if a.family in ("transformer", "linear"):  # linear: chunk states combine in one cumulative sum
        d = a.n_layers
    elif a.family in ("rnn", "lstm", "gru"):
        d = T + a.n_layers - 1
    elif (a.scan if a.family == "ssm" else scan) == "parallel":
        d = a.n_layers * max(1, math.ceil(math.log2(max(T, 2))))
    else:
        d = T * a.n_layers
    return {"depth_steps": d}


def estimate(a: Arch, w: Workload, hw, allow_beyond_context: bool = False, memory_budget: float | None = None) -> dict:
    """Everything for one (architecture, workload, hardware): the fields of `attnlab cost --json`."""
    total = w.prompt_tokens + w.output_tokens
    # The last output token is emitted, never fed back: the model reads prompt + output - 1 positions.
    read = total - 1
    if read > a.max_seq_len and not allow_beyond_context:
        raise ConfigError(f"{a.name}: {w.prompt_tokens} prompt + {w.output_tokens} output tokens read {read} positions "
                          f"(the last output token is never fed back), which exceeds its context of "
                          f"{a.max_seq_len}; pass --allow-beyond-context to compute anyway")
    pre = forward_flops(a, w.prompt_tokens, 0, w.batch, head_rows=1)
    pre_b = forward_bytes(a, w.prompt_tokens, 0, w.batch, w.dtype, head_rows=1)
    mid = w.prompt_tokens + w.output_tokens // 2  # the average context a decode step sees
    dec = forward_flops(a, 1, mid, w.batch)
    dec_b = forward_bytes(a, 1, mid, w.batch, w.dtype)
    ops = OPS_PER_LAYER * a.n_layers + 4
    ttft = roofline_s(pre["total"], pre_b["total"], hw, w.dtype, ops, typical_matmul_size(a, w.prompt_tokens),
                      forward_elementwise(a, w.prompt_tokens, 0, w.batch, sampled_rows=1)["total"])
    tpot = roofline_s(dec["total"], dec_b["total"], hw, w.dtype, ops, typical_matmul_size(a, 1),
                      elements=forward_elementwise(a, 1, mid, w.batch, sampled_rows=1)["total"])
    train = {k: 3 * v for k, v in forward_flops(a, w.prompt_tokens, 0, w.batch).items()}
    p = params(a)
    kv_total = kv_cache_bytes(a, total, w.batch, w.dtype)
    act_peak = w.batch * w.prompt_tokens * max(a.hidden_dim * (2 if a.mlp == "swiglu" else 1), 3 * a.dim) \
        * dtype_bytes(w.dtype)
    memory = weight_bytes(a, w.dtype) + kv_total + act_peak
    budget = memory_budget or hw.memory_bytes
    free = budget - weight_bytes(a, w.dtype) - act_peak
    per_tok = kv_bytes_per_token(a, w.dtype) * w.batch
    max_ctx = int(free // per_tok) if free > 0 else 0
    if a.sliding_window and max_ctx >= a.sliding_window:
        max_ctx = a.max_seq_len  # a rolling window's cache stops growing: the model's own limit binds
    return {
        "model": a.name, "hardware": hw.name, "dtype": w.dtype, "batch": w.batch, "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens, "params": p["total"],
        "prefill_flops": pre["total"], "prefill_flops_by_part": pre, "decode_flops_per_token": dec["total"],
        "decode_flops_by_part": dec, "train_step_flops": train["total"], "train_step_flops_by_part": train,
        "prefill_bytes": pre_b, "decode_bytes_per_token": dec_b,
        "kv_cache_bytes_per_token": kv_bytes_per_token(a, w.dtype), "kv_cache_bytes": kv_total,
        "weight_bytes": weight_bytes(a, w.dtype), "memory_bytes": memory, "max_context_tokens": max_ctx,
        "attention_mlp_crossover_tokens": crossover_tokens(a),
        "ttft_s": ttft, "tpot_s": tpot, "decode_tok_per_s": w.batch / tpot,
        "input_s_per_token": ttft / (w.prompt_tokens * w.batch), "output_s_per_token": tpot / w.batch,
        "output_over_input_cost": (tpot / w.batch) / (ttft / (w.prompt_tokens * w.batch)),
        "total_s": ttft + tpot * (w.output_tokens - 1),
        "prefill_bound": "compute" if pre["total"] / hw.flops(w.dtype) > pre_b["total"] / hw.bandwidth_bytes_per_s
        else "memory",
        "decode_bound": "compute" if dec["total"] / hw.flops(w.dtype) > dec_b["total"] / hw.bandwidth_bytes_per_s
        else "memory",
        "depth": {"prefill": depth(a, w.prompt_tokens)["depth_steps"],
                  "decode_all_outputs": w.output_tokens * depth(a, 1)["depth_steps"]},
    }


def compare(a: Arch, short: int, long: int, dtype: str = "bf16") -> dict:
    """How each part of a prefill grows from `short` to `long` tokens (attention ~ (long/short)^2, MLP linear)."""
    if short <= 0 or long <= 0:
        raise ConfigError("--compare lengths must be > 0")
    s, l = forward_flops(a, short, 0, head_rows=1), forward_flops(a, long, 0, head_rows=1)
    return {"model": a.name, "short": short, "long": long,
            "parts": {k: {"short_flops": s[k], "long_flops": l[k], "factor": l[k] / s[k]} for k in s},
            "kv_cache_bytes": {"short": kv_cache_bytes(a, short, dtype=dtype), "long": kv_cache_bytes(a, long, dtype=dtype)}}

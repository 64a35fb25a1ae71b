"""The cost model across devices: memory per device, TTFT and TPOT with the communication priced.

A layout is three degrees, devices = tensor x sequence x pipeline:

- tensor (Megatron-LM, Shoeybi et al. 2019): every matrix split across t devices; two all-reduces of the
  activations per layer (after attention, after the MLP). Weights / t; K/V heads / min(t, n_kv_heads).
- sequence (ring attention, Liu et al. 2023): the tokens split across s devices, the weights replicated;
  per layer the K/V blocks travel s-1 hops around the ring, overlapped with that layer's attention.
  K/V and activations / s. Decode: each device attends over its share of the cache; the partial results
  are combined (an all-reduce of one row per head and layer).
- pipeline: the layers split into p stages; weights and K/V / p. One prompt still passes every stage in
  turn, so a single request's TTFT and TPOT do not shrink (only a stream of micro-batches fills the pipe);
  each stage boundary adds a send of the activations.

Formulas (each term is in the result): ring all-reduce of n bytes over k devices
2(k-1)/k * n / bandwidth + 2(k-1) * latency; a ring pass of h bytes per hop (k-1) * (h / bandwidth +
latency). Compute is the single-device roofline (analytic.roofline_s) on 1/(t*s) of the FLOPs and of the
bytes that split (weights split only under tensor and pipeline parallelism). The link is NVLink within a
node of ``node_size`` devices and the inter-node link (InfiniBand) beyond it.
"""
from __future__ import annotations

from attnlab.cost.analytic import (OPS_PER_LAYER, Workload, dtype_bytes, estimate, forward_flops, kv_bytes_per_token,
                                   roofline_s)
from attnlab.cost.arch import Arch
from attnlab.errors import ConfigError

PARALLEL = ("tensor", "sequence", "pipeline")


def allreduce_s(nbytes: float, k: int, link) -> float:
    """Ring all-reduce: 2(k-1)/k * n / bandwidth + 2(k-1) * latency (0 on one device)."""
    return 0.0 if k <= 1 else 2 * (k - 1) / k * nbytes / link.bandwidth_bytes_per_s + 2 * (k - 1) * link.latency_s


def ring_pass_s(hop_bytes: float, k: int, link) -> float:
    """Every block once around a ring of k: (k-1) * (h / bandwidth + latency)."""
    return 0.0 if k <= 1 else (k - 1) * (hop_bytes / link.bandwidth_bytes_per_s + link.latency_s)


def layout(devices: int, mode: str) -> dict:
    if mode not in PARALLEL:
        raise ConfigError(f"--parallel {mode!r} is not known; choose one of: {', '.join(PARALLEL)}")
    if devices < 1:
        raise ConfigError(f"--devices {devices} must be >= 1")
    return {"tensor": 1, "sequence": 1, "pipeline": 1, mode: devices}


def check_layout(a: Arch, t: int, s: int, p: int) -> None:
    if a.n_heads % t:
        raise ConfigError(f"{a.name}: tensor parallelism over {t} devices needs them to divide n_heads={a.n_heads}")
    if p > a.n_layers:
        raise ConfigError(f"{a.name}: {p} pipeline stages for {a.n_layers} layers; use at most {a.n_layers}")


def estimate_devices(a: Arch, w: Workload, hw, link_intra, link_inter, tensor: int = 1, sequence: int = 1,
                     pipeline: int = 1, node_size: int = 8, allow_beyond_context: bool = False) -> dict:
    """Memory per device, TTFT and TPOT on tensor x sequence x pipeline devices, communication included."""
    t, s, p = tensor, sequence, pipeline
    check_layout(a, t, s, p)
    n = t * s * p
    base = estimate(a, w, hw, allow_beyond_context=allow_beyond_context)
    b, L, B, T = dtype_bytes(w.dtype), a.n_layers, w.batch, w.prompt_tokens
    weights, kv = base["weight_bytes"], base["kv_cache_bytes"]
    act = base["memory_bytes"] - weights - kv
    mem = {"weights": weights / (t * p), "kv_cache": kv / (min(t, a.n_kv_heads) * s * p), "activations": act / (t * s)}
    mem["total"] = sum(mem.values())
    # links: tensor groups sit inside a node; the sequence ring crosses nodes once t*s exceeds a node
    t_link = link_intra
    s_link = link_intra if t * s <= node_size else link_inter
    p_link = link_intra if n <= node_size else link_inter
    ops = OPS_PER_LAYER * L + 4
    pre_b = base["prefill_bytes"]
    split_bytes = pre_b["total"] - pre_b["weights"] + pre_b["weights"] / s  # under sequence parallel each reads all
    compute_pre = roofline_s(base["prefill_flops"] / (t * s), split_bytes / (t * s), hw, w.dtype, ops, a.dim)
    dec_b = base["decode_bytes_per_token"]
    compute_dec = roofline_s(base["decode_flops_per_token"] / t,
                             (dec_b["weights"] / t) + (dec_b["total"] - dec_b["weights"]) / (min(t, a.n_kv_heads) * s),
                             hw, w.dtype, ops, a.dim)
    comm = {"tensor_prefill": 2 * L * allreduce_s(B * (T / s) * a.dim * b, t, t_link),
            "tensor_decode": 2 * L * allreduce_s(B * a.dim * b, t, t_link)}
    hop = B * (T / s) * kv_bytes_per_token(a, w.dtype) / L / min(t, a.n_kv_heads)  # one layer's K/V block
    ring_layer = ring_pass_s(hop, s, s_link)
    attn_layer = roofline_s(forward_flops(a, T, 0, B)["attention"] / L / (t * s), 0, hw, w.dtype)
    comm["sequence_prefill_total"] = L * ring_layer
    comm["sequence_prefill_exposed"] = L * max(0.0, ring_layer - attn_layer)  # what attention cannot hide
    comm["sequence_decode"] = L * allreduce_s(B * a.n_heads * (a.head_dim + 1) * 4, s, s_link)
    comm["pipeline_prefill"] = ring_pass_s(B * T / s * a.dim * b, p, p_link) if p > 1 else 0.0
    comm["pipeline_decode"] = ring_pass_s(B * a.dim * b, p, p_link) if p > 1 else 0.0
    ttft = compute_pre + comm["tensor_prefill"] + comm["sequence_prefill_exposed"] + comm["pipeline_prefill"]
    tpot = compute_dec + comm["tensor_decode"] + comm["sequence_decode"] + comm["pipeline_decode"]
    return {"model": a.name, "hardware": hw.name, "dtype": w.dtype, "devices": n, "tensor": t, "sequence": s,
            "pipeline": p, "links": {"tensor": t_link.name, "sequence": s_link.name, "pipeline": p_link.name},
            "memory_per_device_bytes": mem, "fits": mem["total"] <= hw.memory_bytes,
            "device_memory_bytes": hw.memory_bytes, "compute_prefill_s": compute_pre, "compute_decode_s": compute_dec,
            "comm_s": comm, "ttft_s": ttft, "tpot_s": tpot, "single_device": {k: base[k] for k in (
                "params", "memory_bytes", "ttft_s", "tpot_s", "kv_cache_bytes", "weight_bytes")}}


def fewest_devices(a: Arch, w: Workload, hw, link_intra, link_inter, mode: str, limit: int = 1 << 16,
                   allow_beyond_context: bool = False) -> dict | None:
    """The fewest devices of one kind of parallelism whose memory holds the workload (None: none up to ``limit``)."""
    cands = [d for d in range(1, a.n_heads + 1) if a.n_heads % d == 0] if mode == "tensor" else (
        range(1, a.n_layers + 1) if mode == "pipeline" else _doubling(limit))
    best = None
    for d in cands:
        res = estimate_devices(a, w, hw, link_intra, link_inter, **layout(d, mode),
                               allow_beyond_context=allow_beyond_context)
        if res["fits"]:
            best = res
            break
    if best is None or mode != "sequence" or best["devices"] == 1:
        return best
    lo, hi = best["devices"] // 2 + 1, best["devices"]  # doubling overshoots: search the last interval
    while lo < hi:
        mid = (lo + hi) // 2
        res = estimate_devices(a, w, hw, link_intra, link_inter, sequence=mid,
                               allow_beyond_context=allow_beyond_context)
        if res["fits"]:
            hi, best = mid, res
        else:
            lo = mid + 1
    return best


def _doubling(limit: int):
    d = 1
    while d <= limit:
        yield d
        d *= 2


def devices_to_prefill(a: Arch, tokens: int, within_s: float, hw, link_intra, link_inter, dtype: str = "bf16",
                       node_size: int = 8, limit: int = 1 << 14) -> dict | None:
    """Fewest devices that hold a ``tokens``-long prompt and prefill it within ``within_s``: tensor parallel
    inside a node (the smallest t dividing n_heads, up to a node, whose weight share leaves half the memory free;
    pipeline stages p when even a node's worth leaves less), the sequence split across a ring of s such groups
    (ring attention), s doubling. None if no s up to ``limit`` does."""
    import math

    w = Workload(tokens, 1, 1, dtype)
    weights = estimate(a, Workload(1, 1, 1, dtype), hw, allow_beyond_context=True)["weight_bytes"]
    divisors = [d for d in range(1, node_size + 1) if a.n_heads % d == 0]
    t = next((d for d in divisors if weights / d <= hw.memory_bytes / 2), divisors[-1])
    p = min(a.n_layers, max(1, math.ceil(weights / t / (hw.memory_bytes / 2))))
    s = 1
    while s <= limit:
        res = estimate_devices(a, w, hw, link_intra, link_inter, tensor=t, sequence=s, pipeline=p, node_size=node_size,
                               allow_beyond_context=True)
        if res["fits"] and res["ttft_s"] <= within_s:
            return {**res, "prompt_tokens": tokens, "within_s": within_s, "beyond_context": tokens > a.max_seq_len}
        s *= 2
    return None

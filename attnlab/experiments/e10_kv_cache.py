"""Claim 10: the KV cache turns O(n) recomputation per token into O(1) new work, at a memory cost.

Memory is measured, not computed: the peak a decode actually holds at each context length. On a CPU that is
the resident memory of a fresh process (VmHWM, reset after the prefill so only decoding counts) above its
resident size before the state was allocated, with glibc's mmap threshold fixed at 64 KiB so that every large
tensor is its own mapping, returned to the system when freed: resident bytes then follow the live tensors, not
what the allocator keeps for later. On CUDA it is torch's peak allocation above the same baseline.
"""
import gc

import torch

from attnlab.bench import reset_peak_resident, resident_bytes, run_fresh
from attnlab.config import preset
from attnlab.cost.analytic import kv_bytes_per_token
from attnlab.cost.arch import from_model_config
from attnlab.engine import generate
from attnlab.engine.generate import decode_one_token, prefill
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Decision, Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "The KV cache"
CLAIM = ("Caching keys and values makes each decode step's cost independent of recomputing the prefix; the cache "
         "grows linearly with context, while an RNN's state stays constant.")
PREDICTION = ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
              "flat, so the speedup grows with context. The peak memory measured while decoding grows linearly with "
              "the context, by 2*L*Hkv*D*bytes per token.")
THRESHOLD = ("Supported if the speedup grows with context and is >= 3x at the longest context, both beyond the spread "
             "of the repeats, and the peak memory measured while decoding grows linearly at the formula's rate: fitted "
             "bytes per token within 20% of 2*L*Hkv*D*bytes, no length more than 10% of the largest peak off the "
             "line. Not supported if a check fails; inconclusive if repeats straddle a threshold or memory was not "
             "measured.")
CHANGES = [
    {"date": "2026-11-30", "what": "prediction: memory measured while decoding",
     "old": ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
             "flat, so the speedup grows with context. Measured cache bytes equal 2*L*Hkv*D*bytes per token."),
     "new": PREDICTION,
     "why": "The 'measured' bytes were the state's allocation, whose shape is the same formula: equal by construction."},
    {"date": "2026-11-30", "what": "threshold: measured peak memory within a tolerance; speedups beyond their spread",
     "old": "Supported if the speedup grows with context, is >= 3x at the longest context, and measured bytes equal the formula.",
     "new": THRESHOLD,
     "why": ("The peak resident memory of a decoding process could hold more than the cache (copies of it, per-step "
             "temporaries that grow with the context) or less; it now has to match the formula's slope within 20% "
             "and lie on a line. The speedups come with a warm-up and 3 repeats at the shortest and longest context.")},
]
EST_S = {"quick": 6, "full": 14}  # seconds on a 2-core CPU: the report's progress estimate
MIN_SPEEDUP, SLOPE_TOL, LINE_TOL = 3, 0.2, 0.1
REPEATS, NEW_TOKENS = 3, 6


def _model(device):
    torch.manual_seed(0)
    return set_precision(build_model(preset("small-10m", max_seq_len=2048), device), "fp32")


def decode_peaks(lens, new, device) -> list[dict]:
    """Peak bytes held while decoding ``new`` tokens after a prompt of each length, above the bytes held before the
    state was allocated (run in a fresh process on a CPU: see the module docstring)."""
    model = _model(device)
    cuda = torch.device(device).type == "cuda"
    generate(model, list(range(8)), 2)  # one-time setup (thread pools, kernels) before any baseline
    out = []
    with torch.inference_mode():
        for T in lens:
            ids = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T)).to(device)
            for counted in (False, True):  # the first pass grows the allocator's small-object heaps to this length's need
                gc.collect()
                base = torch.cuda.memory_allocated(device) if cuda else resident_bytes("VmRSS")
                state = model.new_state(1, T + new)
                nxt = prefill(model, ids, state).argmax(-1)
                if cuda:
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                else:
                    reset_peak_resident()  # VmHWM := VmRSS: the peak from here on is decoding's
                for _ in range(new):
                    nxt = decode_one_token(model, nxt, state).argmax(-1)
                peak = torch.cuda.max_memory_allocated(device) if cuda else resident_bytes("VmHWM")
                if counted:
                    out.append({"context": T + new, "peak_bytes": peak - base, "state_nbytes": state.nbytes})
                del state, nxt
    return out


def _measured_peaks(lens, new, device) -> list[dict] | str:
    if torch.device(device).type == "cuda":
        return decode_peaks(lens, new, device)
    if resident_bytes("VmHWM") is None:
        return "no /proc/self/status: resident memory cannot be read here"
    try:
        return run_fresh("attnlab.experiments.e10_kv_cache", "decode_peaks", [lens, new, str(device)])
    except (RuntimeError, OSError) as e:
        return f"memory run failed: {e}"


def _tpot(model, ids, use_cache):
    return generate(model, ids, NEW_TOKENS, use_cache=use_cache).stats.tpot_s


def measure(scale: str, device: str) -> dict:
    model = _model(device)
    cfg = model.cfg
    lstm = build_model(preset("lstm-10m"), device).eval()
    lens = [64, 128, 256, 512] if scale == "quick" else [128, 256, 512, 1024, 1536]
    per_tok = kv_bytes_per_token(from_model_config(cfg), "fp32")
    rows, speedups = [], {}
    for T in lens:
        ids = torch.randint(0, cfg.vocab_size, (T,)).tolist()
        generate(model, ids, 2)  # warm-up at this length (the uncached path is one plain forward: warm after the first)
        if T == lens[0]:
            generate(model, ids, 2, use_cache=False)
        reps = REPEATS if T in (lens[0], lens[-1]) else 1
        pairs = [(_tpot(model, ids, True), _tpot(model, ids, False)) for _ in range(reps)]  # interleaved
        speedups[T] = [u / c for c, u in pairs]
        cached, uncached = sorted(p[0] for p in pairs)[reps // 2], sorted(p[1] for p in pairs)[reps // 2]
        rows.append({"context": T, "cached_tpot_s": cached, "uncached_tpot_s": uncached,
                     "speedup": sorted(speedups[T])[reps // 2], "lstm_state_bytes": lstm.new_state(1, T).nbytes})
    peaks = _measured_peaks(lens, NEW_TOKENS, device)
    return {"rows": rows, "lengths": lens, "speedups": {str(T): s for T, s in speedups.items()},
            "formula_bytes_per_token": per_tok, "decode_peaks": peaks if isinstance(peaks, list) else None,
            "memory_error": peaks if isinstance(peaks, str) else None}


def _line(xs, ys):
    """Least-squares y = a + b*x: (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def decide(measured: dict) -> Decision:
    lens = measured["lengths"]
    first, last = measured["speedups"][str(lens[0])], measured["speedups"][str(lens[-1])]
    word = {True: "yes", False: "no", None: "within the spread"}
    grows = True if min(last) > max(first) else (False if max(last) < min(first) else None)
    fast = True if min(last) >= MIN_SPEEDUP else (False if max(last) < MIN_SPEEDUP else None)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    reasons = [f"speedup grows: {med(first):.1f}x ({min(first):.1f}-{max(first):.1f}) at {lens[0]} -> {med(last):.1f}x "
               f"({min(last):.1f}-{max(last):.1f}) at {lens[-1]}: {word[grows]}",
               f"speedup at {lens[-1]} >= {MIN_SPEEDUP}x in every repeat: {word[fast]}"]
    checks = [grows, fast]
    per_tok, peaks = measured["formula_bytes_per_token"], measured.get("decode_peaks")
    if not peaks or len(peaks) < 2 or any(p["peak_bytes"] is None for p in peaks):
        reasons.append("peak memory while decoding: not measured (" + (measured.get("memory_error") or "no data") + ")")
        checks.append(None)
        slope = None
    else:
        xs, ys = [p["context"] for p in peaks], [p["peak_bytes"] for p in peaks]
        a, slope = _line(xs, ys)
        off = max(abs(y - (a + slope * x)) for x, y in zip(xs, ys)) / max(ys)
        on_rate, straight = abs(slope / per_tok - 1) <= SLOPE_TOL, off <= LINE_TOL
        reasons += [f"measured decode peak grows {slope:,.0f} bytes/token vs formula {per_tok:,}: within "
                    f"{SLOPE_TOL:.0%}: {'yes' if on_rate else 'no'} ({slope / per_tok - 1:+.0%})",
                    f"peaks on a line (largest miss {off:.1%} of the largest peak, <= {LINE_TOL:.0%}): "
                    f"{'yes' if straight else 'no'}"]
        checks += [on_rate, straight]
    ok = False if False in checks else (None if None in checks else True)
    figure = (f"cache speedup {med(first):.1f}x at {lens[0]} -> {med(last):.1f}x at {lens[-1]} tokens; "
              + (f"measured {slope:,.0f} bytes/token while decoding vs formula {per_tok:,}" if slope is not None
                 else f"formula {per_tok:,} bytes/token (memory not measured)"))
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows, lens, per_tok = m["rows"], m["lengths"], m["formula_bytes_per_token"]
    peaks = m["decode_peaks"] or []
    for r, p in zip(rows, peaks):
        r.update({"decode_peak_bytes": p["peak_bytes"], "state_nbytes": p["state_nbytes"],
                  "formula_bytes": per_tok * p["context"]})
    ctx = [p["context"] for p in peaks]
    return Outcome.of(decide(m), m,
                      [Plot("Decode speedup from the KV cache", "context tokens", "x faster",
                            [Series("speedup", lens, [r["speedup"] for r in rows])]),
                       Plot("Bytes held while decoding vs context", "context tokens (prompt + new)", "bytes",
                            [Series("measured peak while decoding", ctx, [p["peak_bytes"] for p in peaks]),
                             Series("formula 2*L*Hkv*D*4 per token", ctx, [per_tok * c for c in ctx]),
                             Series("LSTM state (tensor bytes)", lens, [r["lstm_state_bytes"] for r in rows])],
                            log_y=True)], rows,
                      ["The uncached mode reruns the whole sequence for every token (attnlab generate --no-cache).",
                       f"Speedups: median of {REPEATS} interleaved cached/uncached runs at the shortest and longest "
                       "context, one elsewhere, after a warm-up.",
                       "Decode peak: a fresh process's peak resident memory while decoding, above what it held before "
                       "the state was allocated (large tensors mapped one by one, so resident bytes follow live tensors); "
                       "it includes the cache and every per-step temporary. The LSTM's is its state's tensor bytes."])

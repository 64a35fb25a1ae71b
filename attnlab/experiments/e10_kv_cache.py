"""Claim 10: the KV cache turns O(n) recomputation per token into O(1) new work, at a memory cost.

Memory is the process's resident memory, measured as the cache grows, in a fresh process per repetition: the
transformer decodes into a paged cache whose pool is backed by fresh mapped pages (the operating system gives a
page physical memory only when it is first written), so resident memory grows with the blocks the cache really
writes, and anything else the decode holds on to shows as well; the LSTM's state is measured the same way. Both
are read (freed heap pages returned to the OS first) after a prefill of each length and after every decoded token.
The allocator's own count of the blocks in use (the pool's shape times the blocks: the formula by construction) is
shown beside, not decided.
"""
import torch

from attnlab.config import preset
from attnlab.cost.analytic import kv_bytes_per_token
from attnlab.cost.arch import from_model_config
from attnlab.engine import generate
from attnlab.engine.generate import decode_one_token, prefill
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, Series, condition, fit_exponent, in_regime,
                                      over_repeats, verdict)
from attnlab.models import build_model
from attnlab.models.paged import PagedKVCache
from attnlab.timing import resident_memory_readable, run_fresh, settled_resident_bytes

TITLE = "The KV cache"
CLAIM = ("Caching keys and values makes each decode step's cost independent of recomputing the prefix; the cache "
         "grows linearly with context, while an RNN's state stays constant.")
PREDICTION = ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
              "flat, so the speedup grows with context. The bytes the cache holds grow linearly with the context as "
              "it is decoded, by 2*L*Hkv*D*bytes per token, while an LSTM's state holds the same bytes at any context.")
THRESHOLD = ("Each of >= 3 repetitions is decided alone: supported if the speedup at the longest context is >= 3x and "
             ">= 2x the speedup at the shortest (it grows with context), the uncached step's growth exponent (least "
             "squares of log time on log context over every context) is near 1 (0.6-1.4: in proportion) and the "
             "cached step's near 0 (-0.4-0.4: nearly flat), the resident memory the growing cache adds "
             "(its own fresh process) fits a line at the formula's rate (fitted bytes per token within 20% of "
             "2*L*Hkv*D*bytes, no point more than 10% of the largest off the line), and the LSTM's run adds the same "
             "resident memory at every context (growth below 5% of the cache's rate). Not supported if a check "
             "fails: the uncached exponent <= 0.5 or >= 1.5 (at or past midway to flat or to quadratic), or the "
             "cached one >= 0.5 (at or past midway to proportional); an exponent between those bounds, a cached one "
             "below -0.4 (a step that gets faster with context: a cold first call) or one that cannot be fitted is "
             "inconclusive. Repetitions that disagree make the verdict inconclusive (unstable); unmeasured memory is "
             "inconclusive.")
_THRESHOLD_SPEEDUPS = (  # as CHANGES quotes it: before the step exponents were decided
    "Each of >= 3 repetitions is decided alone: supported if the speedup at the longest context is >= 3x and >= 2x "
    "the speedup at the shortest (it grows with context), the resident memory the growing cache adds (its own fresh"
    " process) fits a line at the formula's rate (fitted bytes per token within 20% of 2*L*Hkv*D*bytes, no point "
    "more than 10% of the largest off the line), and the LSTM's run adds the same resident memory at every context "
    "(growth below 5% of the cache's rate). Not supported if a check fails. Repetitions that disagree make the "
    "verdict inconclusive (unstable); unmeasured memory is inconclusive.")
THRESHOLD_OLD = ("Each of >= 3 repetitions is decided alone: supported if the speedup at the longest context is >= 3x "
                 "and >= 2x the speedup at the shortest (it grows with context), the bytes the cache holds while "
                 "growing fit a line at the formula's rate (fitted bytes per token within 20% of 2*L*Hkv*D*bytes, no "
                 "point more than 10% of the largest off the line), and the LSTM's state holds the same bytes at every "
                 "context (growth below 1% of the cache's rate). Not supported if a check fails. Repetitions that "
                 "disagree make the verdict inconclusive (unstable); unmeasured memory is inconclusive.")
REGIME = ("Contexts where recomputing the prefix is real work and growth can show: the longest context >= 512 tokens "
          "and >= 8x the shortest; the memory measured as the cache grows (resident pages the cache writes, not a "
          "preallocation or the allocator's count), read at every one of those contexts, on a pool really backed "
          "lazily (an empty pool takes <= 5% of its bytes in resident memory, beyond 128 KiB of heap noise).")
REGIME_OLD = ("Contexts where recomputing the prefix is real work and growth can show: the longest context >= 512 "
              "tokens and >= 8x the shortest; the memory counted as the cache grows (the paged cache's blocks in use, "
              "not a preallocation), read at every one of those contexts.")
CHANGES = [
    {"date": "2026-11-30", "what": "prediction: memory measured while decoding",
     "old": ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
             "flat, so the speedup grows with context. Measured cache bytes equal 2*L*Hkv*D*bytes per token."),
     "new": ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
             "flat, so the speedup grows with context. The peak memory measured while decoding grows linearly with "
             "the context, by 2*L*Hkv*D*bytes per token."),
     "why": "The 'measured' bytes were the state's allocation, whose shape is the same formula: equal by construction."},
    {"date": "2026-11-30", "what": "threshold: measured peak memory within a tolerance; speedups beyond their spread",
     "old": "Supported if the speedup grows with context, is >= 3x at the longest context, and measured bytes equal the formula.",
     "new": ("Supported if the speedup grows with context and is >= 3x at the longest context, both beyond the spread "
             "of the repeats, and the peak memory measured while decoding grows linearly at the formula's rate: fitted "
             "bytes per token within 20% of 2*L*Hkv*D*bytes, no length more than 10% of the largest peak off the "
             "line. Not supported if a check fails; inconclusive if repeats straddle a threshold or memory was not "
             "measured."),
     "why": ("The peak resident memory of a decoding process could hold more than the cache (copies of it, per-step "
             "temporaries that grow with the context) or less; it now has to match the formula's slope within 20% "
             "and lie on a line. The speedups come with a warm-up and 3 repeats at the shortest and longest context.")},
    {"date": "2026-12-02", "what": ("prediction, threshold and method: memory counted as the cache grows (paged "
                                    "blocks in use, LSTM state storage); repetitions; the LSTM half decided"),
     "old": ("Prediction: the peak memory measured while decoding grows linearly, by 2*L*Hkv*D*bytes per token. "
             "Method: the peak resident memory of a fresh process decoding into a contiguous cache preallocated (torch.zeros) "
             "for the whole prompt + new tokens, above its size before; the LSTM's bytes from a new, unused state "
             "(a formula); speedups decided on their spread over repeats; the LSTM not in the verdict."),
     "new": PREDICTION + " " + THRESHOLD_OLD,
     "why": ("Issue 29: a state preallocated for the whole length makes the resident peak grow at the formula's rate by "
             "construction. The cache now grows block by block from the pool's allocator, counted after every "
             "token; the LSTM's state is read from its storage after the tokens have run; the claim's 'an RNN's "
             "state stays constant' is now decided; each of 3 repetitions is decided alone.")},
]
REPEATS, NEW_TOKENS, MIN_LONGEST, MIN_RANGE = FULL_REPEATS, 6, 512, 8
MEMORY_NEW_TOKENS = 48  # decoded after each prefill while memory is read: three 16-token blocks, so decoding grows it
LAZY_SHARE = 0.05  # the REGIME: resident memory a fresh pool takes before any write, as a share of its bytes...
HEAP_NOISE_BYTES = 128 << 10  # ... beyond the heap pages that come and go between two readings (tens of KiB)
METHOD = ("the resident memory a fresh process adds as the paged cache grows (its pool on pages the OS backs only when "
          f"first written), read after a prefill of each length and after each of {MEMORY_NEW_TOKENS} decoded tokens, "
          "one process per repetition; the LSTM's read the same way; the allocator's count shown, not decided.")
CHANGES.append(
    {"date": "2026-12-05", "what": "method and threshold: memory as the resident pages the growing cache writes, per "
                                   "repetition; the allocator's count shown, not decided",
     "old": THRESHOLD_OLD + " Method: the paged cache's blocks in use times a block's bytes of the pool (the pool "
            "preallocated with zeros), the LSTM's state tensors' storage; read once for all repetitions. Regime: "
            + REGIME_OLD,
     "new": _THRESHOLD_SPEEDUPS + " Method: " + METHOD + " Regime: " + REGIME,
     "why": ("Issue 29's independent read: blocks in use times the pool's bytes per block is the formula by "
             "construction (reference 679adec: 18,432 bytes per token against 18,432 exactly), and a fixed-size "
             "state's storage is fixed by construction; neither could fail, and both were read once for the three "
             "repetitions. Resident memory is what the process really occupies: a copy of the cache, a leak or a "
             "temporary kept alive would show. The LSTM's flatness bar goes from 1% to 5% of the cache's rate: its "
             "resident readings carry the heap's noise (a quick run read -386 bytes/token, 2% of the cache's rate, "
             "against 18,504 for the cache), which a fixed-size state's storage never had. Prediction unchanged. Verdict before: supported (679adec, 3 of 3); "
             "after, on the same data: inconclusive (regime not reached: no resident memory was measured).")})
CHANGES.append(
    {"date": "2026-12-07", "what": "threshold: 'in proportion to the context' and 'nearly flat' decided (growth exponents)",
     "old": _THRESHOLD_SPEEDUPS, "new": THRESHOLD,
     "why": ("Issue 29's independent read: the prediction's first two clauses (the uncached step slows down in "
             "proportion to the context, the cached one stays nearly flat) were never decided; only their ratio, the "
             "speedup, was. Each is now a growth exponent banded as claim 8 bands its remedies' (near the predicted "
             "exponent by 0.1 inside midway to the next power; not supported at or past midway): 0.6-1.4, refuted "
             "at <= 0.5 or >= 1.5, for the uncached step; -0.4-0.4, refuted at >= 0.5, for the cached one. The "
             "bands follow that rule but were written with the reference's data in view, so the next reference run "
             "is their first test. Regime and prediction unchanged. Verdict before: supported (6685c0e, 3 of 3); "
             "after, on the same data: supported (3 of 3; uncached exponents 0.77, 0.97, 0.93, cached 0.06, 0.13, "
             "0.11).")})
EST_S = {"quick": 12, "full": 45}  # seconds on a 2-core CPU: the report's progress estimate
# FLAT_STATE: the LSTM's resident growth per token must stay below this share of the cache's. Resident memory carries
# heap noise (a few hundred KiB over the contexts, about 2% of the cache's rate: CHANGES 2026-12-05), which the
# allocator's count of a fixed-size state never had; the cache grows 20x faster than this bar.
MIN_SPEEDUP, MIN_GROWTH, SLOPE_TOL, LINE_TOL, FLAT_STATE = 3, 2, 0.2, 0.1, 0.05
# The prediction's step exponents, banded as claim 8 bands its remedies': near the predicted exponent by 0.1 inside
# midway to the next power, refuted at or past midway (the THRESHOLD above).
UNCACHED_NEAR, UNCACHED_MIDWAYS = (0.6, 1.4), (0.5, 1.5)  # predicted 1: midway to 0 and to 2
CACHED_NEAR, CACHED_MIDWAY = (-0.4, 0.4), 0.5  # predicted 0: midway to 1


def _model(device):
    torch.manual_seed(0)
    return set_precision(build_model(preset("small-10m", max_seq_len=2048), device), "fp32")


def held_bytes(state) -> int:
    """Bytes of storage a state holds by the allocator's count (shown, not decided): a paged cache's blocks in use
    times a block's share of the pool's storage; a fixed-size state's tensors' storage, each storage counted once."""
    if isinstance(state, PagedKVCache):
        pool = state.pool
        per_block = sum(t.untyped_storage().nbytes() for t in pool.k + pool.v) // pool.n_blocks
        return len({b for table in state.tables for b in table}) * per_block
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state.t.values()}
    return sum(storages.values())


def _back_lazily(state) -> None:
    """A paged cache's pool on fresh tensors whose pages the operating system backs only when first written (in a
    process where large allocations are mapped: timing.MMAP_ENV), so resident memory grows with the blocks the
    cache writes. Fresh mapped pages read as zero, as the pool's own zeros do."""
    if isinstance(state, PagedKVCache):
        pool = state.pool
        pool.k, pool.v = [torch.empty_like(t) for t in pool.k], [torch.empty_like(t) for t in pool.v]


def _pool_bytes(state) -> int:
    return sum(t.untyped_storage().nbytes() for t in state.pool.k + state.pool.v) if isinstance(state, PagedKVCache) \
        else sum(t.untyped_storage().nbytes() for t in state.t.values())


@torch.inference_mode()
def growth(model, lens, new, device, paged: bool) -> list[dict]:
    """[{"context", "bytes", "counted_bytes", "unwritten_bytes", "state_bytes"}] after a prefill of each length and
    after each of ``new`` decoded tokens. "bytes": the resident memory added since the empty state was made (on a
    CPU with procfs; elsewhere the allocator's count); "counted_bytes": the allocator's count (held_bytes);
    "unwritten_bytes": the resident memory the empty state took before any write (near 0 where the pool is lazily
    backed); "state_bytes": the state's storage."""
    out = []
    resident = resident_memory_readable(device)
    state = None
    for T in lens:
        ids = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(T)).to(device)
        state = None  # the last length's cache freed before the baseline is read, not after it
        before = settled_resident_bytes() if resident else 0
        state = model.new_state(1, T + new, paged=paged)
        if resident:
            _back_lazily(state)
        base = settled_resident_bytes() if resident else 0
        fixed = {"unwritten_bytes": base - before, "state_bytes": _pool_bytes(state)}

        def read(context: int) -> None:
            counted = held_bytes(state)
            out.append({"context": context, "counted_bytes": counted, **fixed,
                        "bytes": settled_resident_bytes() - base if resident else counted})
        nxt = prefill(model, ids, state).argmax(-1)
        read(T)
        for j in range(new):
            nxt = decode_one_token(model, nxt, state).argmax(-1)
            read(T + j + 1)
    return out


def growth_in_fresh_process(lens: list[int], new: int, device: str, model: str = "small-10m",
                            recurrent: str = "lstm-10m") -> dict:
    """The transformer's cache and the LSTM's state growing over ``lens``, in this (fresh) process on ``device``:
    {"kv": growth(...), "lstm": growth(...), "memory": "resident" or "counted"} (run by timing.run_fresh: no earlier
    allocation in the way). Every length is run once first, unread: kernels, thread pools and library scratch made
    at each size are then in place before anything is measured."""
    torch.manual_seed(0)
    kv_model = set_precision(build_model(preset(model, max_seq_len=2048), device), "fp32")
    lstm = build_model(preset(recurrent), device).eval()
    for m, paged in ((kv_model, True), (lstm, False)):
        growth(m, lens, new, device, paged)
    return {"kv": growth(kv_model, lens, new, device, paged=True),
            "lstm": growth(lstm, lens, new, device, paged=False),
            "memory": "resident" if resident_memory_readable(device) else "counted"}


def _tpot(model, ids, use_cache):
    return generate(model, ids, NEW_TOKENS, use_cache=use_cache).stats.tpot_s


def measure(scale: str, device: str) -> dict:
    model = _model(device)
    cfg = model.cfg
    lstm = build_model(preset("lstm-10m"), device).eval()
    lens = [64, 128, 256, 512] if scale == "quick" else [128, 256, 512, 1024, 1536]
    per_tok = kv_bytes_per_token(from_model_config(cfg), "fp32")
    prompts = {T: torch.randint(0, cfg.vocab_size, (T,)).tolist() for T in lens}
    for T in lens:
        generate(model, prompts[T], 2)  # warm-up at this length (the uncached path is one plain forward: warm after one)
    generate(model, prompts[lens[0]], 2, use_cache=False)
    reps = []
    for _ in range(REPEATS):  # each repetition: every length, cached and uncached interleaved
        reps.append([{"context": T, "cached_tpot_s": c, "uncached_tpot_s": u, "speedup": u / c}
                     for T in lens for c, u in [(_tpot(model, prompts[T], True), _tpot(model, prompts[T], False))]])
    med = lambda xs: sorted(xs)[len(xs) // 2]
    rows = [{"context": T, **{k: med([r[i][k] for r in reps]) for k in ("cached_tpot_s", "uncached_tpot_s", "speedup")}}
            for i, T in enumerate(lens)]
    by_rep, error = [], None
    try:
        for _ in range(REPEATS):  # each repetition's memory in a fresh process of its own
            if resident_memory_readable(device):
                g = run_fresh("attnlab.experiments.e10_kv_cache", "growth_in_fresh_process",
                              [lens, MEMORY_NEW_TOKENS, str(device)], what="the KV cache's growth")
            else:  # no resident pages to read: the allocator's count, which the regime does not accept
                g = {"kv": growth(model, lens, MEMORY_NEW_TOKENS, device, paged=True),
                     "lstm": growth(lstm, lens, MEMORY_NEW_TOKENS, device, paged=False), "memory": "counted"}
            by_rep.append(g)
    except (RuntimeError, ValueError) as e:
        by_rep, error = [], f"memory run failed: {e}"
    first = by_rep[0] if by_rep else {"kv": None, "lstm": None}
    return {"rows": rows, "lengths": lens, "repeats": reps, "formula_bytes_per_token": per_tok,
            "kv_growth": first["kv"], "lstm_growth": first["lstm"], "growth_by_repeat": by_rep,
            "memory_error": error,
            "memory": "resident" if by_rep and all(g.get("memory") == "resident" for g in by_rep) else "counted"}


def _line(xs, ys):
    """Least-squares y = a + b*x: (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def _memory(m: dict, i: int = 0) -> tuple[list[str], list]:
    """Reasons and checks (True / False / None) of repetition ``i``'s memory half: the cache's growth and the LSTM's
    flat state."""
    per_tok = m["formula_bytes_per_token"]
    by_rep = m.get("growth_by_repeat")
    g = by_rep[min(i, len(by_rep) - 1)] if by_rep else {"kv": m.get("kv_growth"), "lstm": m.get("lstm_growth")}
    kv, rnn = g["kv"], g["lstm"]
    if not kv or not rnn or len(kv) < 2:
        return ["memory as the cache grows: not measured (" + (m.get("memory_error") or "no data") + ")"], [None]
    xs, ys = [p["context"] for p in kv], [p["bytes"] for p in kv]
    a, slope = _line(xs, ys)
    off = max(abs(y - (a + slope * x)) for x, y in zip(xs, ys)) / max(ys)
    _, lstm_slope = _line([p["context"] for p in rnn], [p["bytes"] for p in rnn])
    on_rate, straight, flat = abs(slope / per_tok - 1) <= SLOPE_TOL, off <= LINE_TOL, abs(lstm_slope) <= FLAT_STATE * per_tok
    sizes = sorted({p["bytes"] for p in rnn})
    what = "resident bytes" if m.get("memory") == "resident" else "bytes counted"
    return [f"cache {what} added while growing: {slope:,.0f} bytes/token vs formula {per_tok:,}: within {SLOPE_TOL:.0%}: "
            f"{'yes' if on_rate else 'no'} ({slope / per_tok - 1:+.0%}); on a line (largest miss {off:.1%} of the "
            f"largest, <= {LINE_TOL:.0%}): {'yes' if straight else 'no'}",
            f"LSTM run, {what}: {sizes[0]:,}-{sizes[-1]:,} bytes over contexts {rnn[0]['context']}-{rnn[-1]['context']} "
            f"({lstm_slope:,.1f} bytes/token, flat below {FLAT_STATE:.0%} of the cache's rate: {'yes' if flat else 'no'})"], \
        [on_rate, straight, flat]


def _regime(m: dict) -> list[dict]:
    lens = m["lengths"]
    kv = m.get("kv_growth") or []
    read = sorted({p["context"] for p in kv} & set(lens))
    return [condition("longest context", lens[-1], f">= {MIN_LONGEST} tokens", lens[-1] >= MIN_LONGEST),
            condition("longest / shortest context", lens[-1] / lens[0], f">= {MIN_RANGE}x",
                      lens[-1] / lens[0] >= MIN_RANGE, f"{lens[-1] / lens[0]:.0f}x"),
            condition("contexts whose growing cache was read", len(read), f"all {len(lens)}", len(read) == len(lens)),
            condition("memory measured", m.get("memory", "counted"), "resident (not the allocator's count)",
                      m.get("memory") == "resident"),
            _lazy(m)]


def _lazy(m: dict) -> dict:
    """The pool really was backed lazily: the resident memory an empty state took before any write, at most
    LAZY_SHARE of its bytes in every repetition and length (else the growth read would be the pool's, made whole)."""
    worst = max(((p["unwritten_bytes"] - HEAP_NOISE_BYTES) / max(p["state_bytes"], 1)
                 for g in m.get("growth_by_repeat") or [] for p in g["kv"] if "unwritten_bytes" in p), default=None)
    return condition("resident memory an empty pool takes (less 128 KiB of heap noise) / its bytes", worst,
                     f"<= {LAZY_SHARE:.0%} (backed lazily)", worst is not None and worst <= LAZY_SHARE,
                     "not measured" if worst is None else f"{max(worst, 0.0):.1%}")


def _step_exponents(rep: list[dict]) -> tuple[float | None, float | None, bool | None, bool | None]:
    """(uncached exponent, cached exponent, in proportion?, nearly flat?): True near the prediction, False at or past
    midway to the next power, None between, for a cached step that falls with context, or unfitted."""
    ctx = [r["context"] for r in rep]
    slow, flat = (fit_exponent(ctx, [r[k] for r in rep]) for k in ("uncached_tpot_s", "cached_tpot_s"))
    proportional = flat_ok = None
    if slow is not None:
        proportional = (True if UNCACHED_NEAR[0] <= slow <= UNCACHED_NEAR[1] else
                        False if slow <= UNCACHED_MIDWAYS[0] or slow >= UNCACHED_MIDWAYS[1] else None)
    if flat is not None:
        flat_ok = True if CACHED_NEAR[0] <= flat <= CACHED_NEAR[1] else (False if flat >= CACHED_MIDWAY else None)
    return slow, flat, proportional, flat_ok


def _one(rep: list[dict], memory: tuple[list[str], list]) -> Decision:
    first, last = rep[0], rep[-1]
    grows, fast = last["speedup"] >= MIN_GROWTH * first["speedup"], last["speedup"] >= MIN_SPEEDUP
    slow, flat, in_proportion, nearly_flat = _step_exponents(rep)
    checks = [grows, fast, in_proportion, nearly_flat] + memory[1]
    ok = False if False in checks else (None if None in checks else True)
    word = {True: "yes", False: "no", None: "between the bands or unfitted"}
    show = lambda e: "not fitted" if e is None else f"{e:.2f}"  # noqa: E731
    return Decision(verdict(ok), f"{last['speedup']:.1f}x", list(memory[0]) + [
        f"speedup {first['speedup']:.1f}x at {first['context']} -> {last['speedup']:.1f}x at {last['context']}: "
        f">= {MIN_SPEEDUP}x {'yes' if fast else 'no'}, >= {MIN_GROWTH}x the shortest's {'yes' if grows else 'no'}; "
        f"step time's growth exponent over the contexts: uncached {show(slow)} (in proportion, "
        f"{UNCACHED_NEAR[0]}-{UNCACHED_NEAR[1]}? {word[in_proportion]}), cached {show(flat)} (nearly flat, "
        f"{CACHED_NEAR[0]}-{CACHED_NEAR[1]}? {word[nearly_flat]})"])


def decide(measured: dict) -> Decision:
    memory, regime = _memory(measured), _regime(measured)
    d = over_repeats([in_regime(regime, _one(rep, _memory(measured, i))) for i, rep in enumerate(measured["repeats"])])
    lens, per_tok, kv = measured["lengths"], measured["formula_bytes_per_token"], measured.get("kv_growth")
    first = sorted(r[0]["speedup"] for r in measured["repeats"])
    last = sorted(r[-1]["speedup"] for r in measured["repeats"])
    mid = len(first) // 2
    slope = _line([p["context"] for p in kv], [p["bytes"] for p in kv])[1] if kv and len(kv) > 1 else None
    figure = (f"cache speedup {first[mid]:.1f}x at {lens[0]} -> {last[mid]:.1f}x at {lens[-1]} tokens (range "
              f"{last[0]:.1f}-{last[-1]:.1f}x); "
              + (f"cache held {slope:,.0f} bytes/token as it grew vs formula {per_tok:,}" if slope is not None
                 else f"formula {per_tok:,} bytes/token (memory not measured)"))
    return Decision(d.verdict, figure, memory[0] + list(d.reasons), d.qualifier, d.regime, d.repeats)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows, lens, per_tok = m["rows"], m["lengths"], m["formula_bytes_per_token"]
    kv, rnn = m["kv_growth"] or [], m["lstm_growth"] or []
    held = {p["context"]: p["bytes"] for p in kv}
    lstm_held = {p["context"]: p["bytes"] for p in rnn}
    for r in rows:
        r.update({"cache_held_bytes": held.get(r["context"]), "formula_bytes": per_tok * r["context"],
                  "lstm_state_bytes": lstm_held.get(r["context"])})
    return Outcome.of(decide(m), m,
                      [Plot("Decode speedup from the KV cache", "context tokens", "x faster",
                            [Series(f"repetition {i + 1}", lens, [r["speedup"] for r in rep])
                             for i, rep in enumerate(m["repeats"])]),
                       Plot("Bytes held as the context grows", "context tokens", "bytes",
                            [Series("KV cache (resident bytes added)", [p["context"] for p in kv], [p["bytes"] for p in kv]),
                             Series("formula 2*L*Hkv*D*4 per token", [p["context"] for p in kv],
                                    [per_tok * p["context"] for p in kv]),
                             Series("LSTM run (resident bytes added)", [p["context"] for p in rnn],
                                    [max(p["bytes"], 1) for p in rnn])],
                            log_y=True)], rows,
                      ["The uncached mode reruns the whole sequence for every token (attnlab generate --no-cache).",
                       f"Speedups: {REPEATS} repetitions, each timing every context cached then uncached after a "
                       "warm-up; the table shows the median.",
                       "Memory: the resident memory a fresh process adds as the paged cache grows (its pool on pages "
                       "backed only when written), read after a prefill of each length and after each decoded token, "
                       "one process per repetition; the allocator's count of the blocks in use is kept beside "
                       "(counted_bytes). The LSTM's: the same reading over the same tokens."])

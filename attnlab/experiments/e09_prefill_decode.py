"""Claim 9: prefill is parallel, decode is sequential."""
import torch

from attnlab.config import preset
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Decision, Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "Prefill is parallel, decode is sequential"
CLAIM = "Reading a prompt processes all its tokens in one parallel pass; generating produces one token per dependent step."
PREDICTION = ("Prefill throughput (tokens/s) is many times decode throughput; time-to-first-token grows slowly "
              "with prompt length while time per output token stays flat; generating m tokens takes m sequential passes.")
THRESHOLD = ("Supported if prefill tokens/s >= 5x decode tokens/s at the longest prompt in every repeat; not supported if "
             "below 5x in every repeat; inconclusive if the repeats straddle 5x.")
CHANGES = [
    {"date": "2026-11-30", "what": "threshold: repeats, and a verdict only when they agree",
     "old": "Supported if prefill tokens/s >= 5x decode tokens/s at the longest prompt.",
     "new": THRESHOLD,
     "why": "One timed generation per length gave a ratio with no spread; the longest prompt now runs 3 timed times "
            "after a warm-up, and a ratio whose repeats fall on both sides of the threshold decides nothing."},
]
EST_S = {"quick": 2, "full": 8}  # seconds on a 2-core CPU: the report's progress estimate
MIN_RATIO, REPEATS = 5, 3


def measure(scale: str, device: str) -> dict:
    torch.manual_seed(0)
    cfg = preset("small-10m", max_seq_len=2048)
    model = set_precision(build_model(cfg, device), "fp32")
    lens = [64, 128, 256, 512] if scale == "quick" else [64, 128, 256, 512, 1024, 1536]
    new = 32 if scale == "quick" else 128
    rows, ratios, last = [], [], None
    for T in lens:
        ids = torch.randint(0, cfg.vocab_size, (T,)).tolist()
        generate(model, ids, 2)  # warm-up at this length
        for _ in range(REPEATS if T == lens[-1] else 1):
            out = generate(model, ids, new)
            st = out.stats
            if T == lens[-1]:
                ratios.append(st.prefill_tok_per_s / st.decode_tok_per_s)
        rows.append({"prompt_tokens": T, "ttft_s": st.ttft_s, "tpot_s": st.tpot_s, "prefill_tok_per_s":
                     st.prefill_tok_per_s, "decode_tok_per_s": st.decode_tok_per_s,
                     "decode_depth_layer_steps": new * cfg.n_layers, "prefill_depth_layer_steps": cfg.n_layers})
        last = out
    return {"rows": rows, "ratios_longest": ratios, "new_tokens": new,
            "step_times_s": [b - a for a, b in zip(last.timings_s, last.timings_s[1:])]}


def decide(measured: dict) -> Decision:
    ratios = sorted(measured["ratios_longest"])
    row = measured["rows"][-1]
    mid = ratios[len(ratios) // 2]
    above = [r >= MIN_RATIO for r in ratios]
    ok = True if all(above) else (False if not any(above) else None)
    reasons = [f"prefill/decode tokens/s at {row['prompt_tokens']} prompt tokens over {len(ratios)} repeats: median "
               f"{mid:.1f}x, range {ratios[0]:.1f}-{ratios[-1]:.1f}x >= {MIN_RATIO}x: "
               + {True: "yes", False: "no", None: "the range straddles it"}[ok]]
    figure = (f"prefill {row['prefill_tok_per_s']:,.0f} tok/s vs decode {row['decode_tok_per_s']:,.0f} tok/s "
              f"({mid:.0f}x, range {ratios[0]:.0f}-{ratios[-1]:.0f}x) at {row['prompt_tokens']} prompt tokens")
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows = m["rows"]
    lens = [r["prompt_tokens"] for r in rows]
    per_token = m["step_times_s"]
    return Outcome.of(decide(m), m,
                      [Plot("Time to first token vs prompt length", "prompt tokens", "seconds",
                            [Series("TTFT", lens, [r["ttft_s"] for r in rows])]),
                       Plot("Throughput by phase", "prompt tokens", "tokens/s",
                            [Series("prefill", lens, [r["prefill_tok_per_s"] for r in rows]),
                             Series("decode", lens, [r["decode_tok_per_s"] for r in rows])], log_y=True),
                       Plot("Time per output token vs position", "output position", "seconds",
                            [Series("step time", list(range(1, len(per_token) + 1)), per_token)])], rows,
                      ["Model: a ~10M-parameter transformer with random weights (speed does not depend on the weights).",
                       "Depth of generating m tokens: m x n_layers dependent layer steps, against n_layers for the prompt.",
                       f"Each length: one warm-up generation, then one timed (the longest prompt: {REPEATS})."])

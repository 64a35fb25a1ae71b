"""Claim 9: prefill is parallel, decode is sequential."""
import torch

from attnlab.config import preset
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "Prefill is parallel, decode is sequential"
CLAIM = "Reading a prompt processes all its tokens in one parallel pass; generating produces one token per dependent step."
PREDICTION = ("Prefill throughput (tokens/s) is many times decode throughput; time-to-first-token grows slowly "
              "with prompt length while time per output token stays flat; generating m tokens takes m sequential passes.")
THRESHOLD = "Supported if prefill tokens/s >= 5x decode tokens/s at the longest prompt."


def run(scale: str, device: str) -> Outcome:
    torch.manual_seed(0)
    cfg = preset("small-10m", max_seq_len=2048)
    model = set_precision(build_model(cfg, device), "fp32")
    lens = [64, 128, 256, 512] if scale == "quick" else [64, 128, 256, 512, 1024, 1536]
    new = 32 if scale == "quick" else 128
    rows, ttft, pre_tps, dec_tps, last = [], [], [], [], None
    for T in lens:
        ids = torch.randint(0, cfg.vocab_size, (T,)).tolist()
        generate(model, ids, 2)
        out = generate(model, ids, new)
        st = out.stats
        ttft.append(st.ttft_s)
        pre_tps.append(st.prefill_tok_per_s)
        dec_tps.append(st.decode_tok_per_s)
        rows.append({"prompt_tokens": T, "ttft_s": st.ttft_s, "tpot_s": st.tpot_s, "prefill_tok_per_s":
                     st.prefill_tok_per_s, "decode_tok_per_s": st.decode_tok_per_s,
                     "decode_depth_layer_steps": new * cfg.n_layers, "prefill_depth_layer_steps": cfg.n_layers})
        last = out
    per_token = [b - a for a, b in zip(last.timings_s, last.timings_s[1:])]
    ratio = pre_tps[-1] / dec_tps[-1]
    return Outcome(verdict(ratio >= 5), f"prefill {pre_tps[-1]:,.0f} tok/s vs decode {dec_tps[-1]:,.0f} tok/s "
                   f"({ratio:.0f}x) at {lens[-1]} prompt tokens", {"rows": rows, "ratio": ratio},
                   [Plot("Time to first token vs prompt length", "prompt tokens", "seconds",
                         [Series("TTFT", lens, ttft)]),
                    Plot("Throughput by phase", "prompt tokens", "tokens/s",
                         [Series("prefill", lens, pre_tps), Series("decode", lens, dec_tps)], log_y=True),
                    Plot("Time per output token vs position", "output position", "seconds",
                         [Series("step time", list(range(1, len(per_token) + 1)), per_token)])], rows,
                   ["Model: a ~10M-parameter transformer with random weights (speed does not depend on the weights).",
                    "Depth of generating m tokens: m x n_layers dependent layer steps, against n_layers for the prompt."])

"""Claim 10: the KV cache turns O(n) recomputation per token into O(1) new work, at a memory cost."""
import torch

from attnlab.config import preset
from attnlab.cost.analytic import kv_bytes_per_token
from attnlab.cost.arch import from_model_config
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Outcome, Plot, Series, verdict
from attnlab.models import build_model

TITLE = "The KV cache"
CLAIM = ("Caching keys and values makes each decode step's cost independent of recomputing the prefix; the cache "
         "grows linearly with context, while an RNN's state stays constant.")
PREDICTION = ("Decode without the cache slows down in proportion to the context; with it the step time stays nearly "
              "flat, so the speedup grows with context. Measured cache bytes equal 2*L*Hkv*D*bytes per token.")
THRESHOLD = "Supported if the speedup grows with context, is >= 3x at the longest context, and measured bytes equal the formula."


def run(scale: str, device: str) -> Outcome:
    torch.manual_seed(0)
    cfg = preset("small-10m", max_seq_len=2048)
    model = set_precision(build_model(cfg, device), "fp32")
    lstm = build_model(preset("lstm-10m"), device).eval()
    lens = [64, 128, 256, 512] if scale == "quick" else [128, 256, 512, 1024, 1536]
    rows, speed, kv_bytes, rnn_bytes, formula = [], [], [], [], []
    per_tok = kv_bytes_per_token(from_model_config(cfg), "fp32")
    for T in lens:
        ids = torch.randint(0, cfg.vocab_size, (T,)).tolist()
        cached = generate(model, ids, 6)
        uncached = generate(model, ids, 6, use_cache=False)
        s = uncached.stats.tpot_s / cached.stats.tpot_s
        speed.append(s)
        state = model.new_state(1, T)
        kv_bytes.append(state.nbytes)
        formula.append(per_tok * T)
        rnn_bytes.append(lstm.new_state(1, T).nbytes)
        rows.append({"context": T, "cached_tpot_s": cached.stats.tpot_s, "uncached_tpot_s": uncached.stats.tpot_s,
                     "speedup": s, "kv_bytes": state.nbytes, "formula_bytes": per_tok * T, "lstm_state_bytes": rnn_bytes[-1]})
    ok = speed[-1] >= 3 and speed[-1] > speed[0] and kv_bytes == formula
    return Outcome(verdict(ok), f"cache speedup {speed[0]:.1f}x at {lens[0]} -> {speed[-1]:.1f}x at {lens[-1]} tokens; "
                   f"{per_tok:,} bytes/token", {"rows": rows},
                   [Plot("Decode speedup from the KV cache", "context tokens", "x faster", [Series("speedup", lens, speed)]),
                    Plot("State bytes vs context", "context tokens", "bytes", [Series("KV cache (measured)", lens, kv_bytes),
                         Series("formula", lens, formula), Series("LSTM state", lens, rnn_bytes)], log_y=True)], rows,
                   ["The uncached mode reruns the whole sequence for every token (attnlab generate --no-cache)."])

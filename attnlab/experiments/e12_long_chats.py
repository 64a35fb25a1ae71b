"""Claim 12: a chat that resends its history pays for it again every turn; a cached prefix does not."""
import torch

from attnlab.config import preset
from attnlab.engine import SamplingParams
from attnlab.engine.engine import Engine
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Outcome, Plot, Series, fit_exponent, verdict
from attnlab.models import build_model

TITLE = "Long chats get expensive"
CLAIM = "A k-turn conversation that resends its whole history costs O(k^2) prompt processing; reusing the cached prefix costs O(k)."
PREDICTION = ("Cumulative prefill tokens grow quadratically in turns when history is resent, linearly with prefix "
              "reuse, and the cumulative time of the reuse strategy is several times lower by the last turn.")
THRESHOLD = ("Supported if resent prefill tokens grow with exponent >= 1.5 in k and the cumulative prompt-processing "
             "time (time to first token) with reuse is >= 2x lower by the last turn.")


def _chat(model, turns, user, reply, reuse):
    engine = Engine(model, None, prefix_reuse=reuse)
    history, cum_tokens, cum_time, rows = [], 0, 0.0, []
    g = torch.Generator().manual_seed(0)
    for turn in range(turns):
        history += torch.randint(0, 256, (user,), generator=g).tolist()
        out = engine.generate(list(history), reply, SamplingParams())
        cum_time += out.stats.ttft_s  # the prompt-processing part of the turn (replies cost the same either way)
        cum_tokens += len(history) - out.stats.reused_prefix_tokens
        history += out.tokens
        rows.append((turn + 1, cum_tokens, cum_time))
    return rows


def run(scale: str, device: str) -> Outcome:
    torch.manual_seed(0)
    model = set_precision(build_model(preset("small-10m", max_seq_len=2048), device), "fp32")
    turns, user, reply = (8, 48, 16) if scale == "quick" else (20, 48, 24)
    resend, reuse = _chat(model, turns, user, reply, False), _chat(model, turns, user, reply, True)
    ks = [r[0] for r in resend]
    exp = fit_exponent(ks[1:], [r[1] for r in resend][1:])
    gain = resend[-1][2] / reuse[-1][2]
    ok = (exp or 0) >= 1.5 and gain >= 2
    rows = [{"turn": a[0], "resend_prefill_tokens": a[1], "reuse_prefill_tokens": b[1], "resend_s": a[2], "reuse_s": b[2]}
            for a, b in zip(resend, reuse)]
    return Outcome(verdict(ok), f"after {turns} turns: {resend[-1][1]:,} vs {reuse[-1][1]:,} prompt tokens processed, "
                   f"{gain:.1f}x less prompt-processing time with the cached prefix", {"rows": rows, "exponent": exp, "time_gain": gain},
                   [Plot("Cumulative prompt tokens processed", "turn", "tokens", [Series("resend history", ks, [r[1] for r in resend]),
                         Series("reuse cached prefix", ks, [r[1] for r in reuse])]),
                    Plot("Cumulative prompt-processing time (TTFT)", "turn", "seconds", [Series("resend history", ks, [r[2] for r in resend]),
                         Series("reuse cached prefix", ks, [r[2] for r in reuse])])], rows,
                   [f"Each turn adds {user} user tokens and generates {reply}; a ~10M-parameter model."])

"""Claim 12: a chat that resends its history pays for it again every turn; a cached prefix does not.

Both strategies are timed end to end, as a user waits for them: the wall time of each turn's call, the reply
included, after an untimed warm-up chat of each; the two alternate in order over the repeats. The prompt tokens
each strategy processes are counted too, but that count is a sum of history lengths (bookkeeping, the model).
"""
import time

import torch

from attnlab.config import preset
from attnlab.engine import SamplingParams
from attnlab.engine.engine import Engine
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import Decision, Outcome, Plot, Series, compare, fit_exponent, mean, spread, verdict
from attnlab.models import build_model

TITLE = "Long chats get expensive"
CLAIM = "A k-turn conversation that resends its whole history costs O(k^2) prompt processing; reusing the cached prefix costs O(k)."
PREDICTION = ("Cumulative prefill tokens grow quadratically in turns when history is resent, linearly with prefix "
              "reuse; measured end to end, replies included, the reuse strategy's cumulative time is lower by the "
              "last turn, by a margin that grows with the turns.")
THRESHOLD = ("Supported if the cumulative end-to-end time by the last turn (replies included, after a warm-up) is lower "
             "with prefix reuse than with resending by more than the spread over repeats and by >= 1.25x; not "
             "supported if it is not lower beyond that spread or the gain is below 1.25x; inconclusive if the "
             "difference is within the spread. The resent-token exponent is bookkeeping (model), not in the verdict.")
CHANGES = [
    {"date": "2026-11-30", "what": "prediction: end-to-end time, replies included",
     "old": ("Cumulative prefill tokens grow quadratically in turns when history is resent, linearly with prefix "
             "reuse, and the cumulative time of the reuse strategy is several times lower by the last turn."),
     "new": PREDICTION,
     "why": "The time compared was the prompt-processing part only; a user waits for the reply too."},
    {"date": "2026-11-30", "what": "threshold: measured end-to-end time decides; the token count is the model",
     "old": ("Supported if resent prefill tokens grow with exponent >= 1.5 in k and the cumulative prompt-processing "
             "time (time to first token) with reuse is >= 2x lower by the last turn."),
     "new": THRESHOLD,
     "why": ("The resent-token count is a sum of history lengths, quadratic by construction, so that half could not "
             "fail; the time half now measures what a user waits for (every turn's call, its reply included, which "
             "costs the same either way and so dilutes the gain: hence 1.25x rather than 2x), with a warm-up and "
             "3 alternating repeats whose spread the difference must beat.")},
]
EST_S = {"quick": 9, "full": 30}  # seconds on a 2-core CPU: the report's progress estimate
MIN_GAIN, REPEATS = 1.25, 3


def _chat(model, turns, user, reply, reuse):
    """[(turn, cumulative prompt tokens processed, cumulative end-to-end seconds)] for one conversation."""
    engine = Engine(model, None, prefix_reuse=reuse)
    history, cum_tokens, cum_s, rows = [], 0, 0.0, []
    g = torch.Generator().manual_seed(0)
    for turn in range(turns):
        history += torch.randint(0, 256, (user,), generator=g).tolist()
        t = time.perf_counter()
        out = engine.generate(list(history), reply, SamplingParams())
        cum_s += time.perf_counter() - t  # the whole call: prompt processing and the reply
        cum_tokens += len(history) - out.stats.reused_prefix_tokens
        history += out.tokens
        rows.append((turn + 1, cum_tokens, cum_s))
    return rows


def measure(scale: str, device: str) -> dict:
    torch.manual_seed(0)
    model = set_precision(build_model(preset("small-10m", max_seq_len=2048), device), "fp32")
    turns, user, reply = (8, 48, 16) if scale == "quick" else (20, 48, 24)
    for reuse in (False, True):  # warm-up: each strategy's code path once, untimed
        _chat(model, 2, user, reply, reuse)
    runs = {"resend": [], "reuse": []}
    for i in range(REPEATS):  # alternating order, so neither strategy always runs second
        for name in (("resend", "reuse") if i % 2 == 0 else ("reuse", "resend")):
            runs[name].append(_chat(model, turns, user, reply, name == "reuse"))
    ks = [r[0] for r in runs["resend"][0]]
    tokens = {name: [r[1] for r in rs[0]] for name, rs in runs.items()}  # the same in every repeat
    cum_s = {name: [sorted(rep[j][2] for rep in rs)[REPEATS // 2] for j in range(turns)] for name, rs in runs.items()}
    return {"turns": turns, "user_tokens": user, "reply_tokens": reply, "ks": ks, "prompt_tokens": tokens,
            "cumulative_s": cum_s, "total_s_by_repeat": {name: [rep[-1][2] for rep in rs] for name, rs in runs.items()},
            "resent_token_exponent": fit_exponent(ks[1:], tokens["resend"][1:])}


def decide(measured: dict) -> Decision:
    resend, reuse = measured["total_s_by_repeat"]["resend"], measured["total_s_by_repeat"]["reuse"]
    faster = compare(resend, reuse)  # True: resend slower beyond the spread
    gain = mean(resend) / mean(reuse)
    noise = max(spread(resend), spread(reuse))
    reasons = [f"cumulative end-to-end time after {measured['turns']} turns: resend {mean(resend):.2f} s, reuse "
               f"{mean(reuse):.2f} s; difference {mean(resend) - mean(reuse):.2f} s beyond the spread {noise:.2f} s: "
               + {True: "yes", False: "no: reuse slower beyond it", None: "within the spread"}[faster]]
    if faster:
        reasons.append(f"gain {gain:.2f}x >= {MIN_GAIN}x: {'yes' if gain >= MIN_GAIN else 'no'}")
        ok = gain >= MIN_GAIN
    else:
        ok = faster  # None (within the spread) or False
    exp = measured.get("resent_token_exponent")
    tok = measured.get("prompt_tokens", {})
    if exp is not None:
        reasons.append(f"model (not in the verdict): resent prompt tokens grow as k^{exp:.2f}")
    figure = (f"after {measured['turns']} turns: {gain:.2f}x less end-to-end time with the cached prefix (replies "
              "included)" + (f"; {tok['resend'][-1]:,} vs {tok['reuse'][-1]:,} prompt tokens processed" if tok else ""))
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    ks, tok, cum = m["ks"], m["prompt_tokens"], m["cumulative_s"]
    rows = [{"turn": k, "resend_prefill_tokens": tok["resend"][i], "reuse_prefill_tokens": tok["reuse"][i],
             "resend_s": cum["resend"][i], "reuse_s": cum["reuse"][i]} for i, k in enumerate(ks)]
    return Outcome.of(decide(m), m,
                      [Plot("Cumulative prompt tokens processed (bookkeeping)", "turn", "tokens",
                            [Series("resend history", ks, tok["resend"]), Series("reuse cached prefix", ks, tok["reuse"])]),
                       Plot("Cumulative end-to-end time, replies included", "turn", "seconds",
                            [Series("resend history", ks, cum["resend"]), Series("reuse cached prefix", ks, cum["reuse"])])],
                      rows,
                      [f"Each turn adds {m['user_tokens']} user tokens and generates {m['reply_tokens']}; a "
                       "~10M-parameter model with random weights.",
                       f"Times: median over {REPEATS} repeats, alternating which strategy runs first, after one untimed "
                       "2-turn chat of each."])

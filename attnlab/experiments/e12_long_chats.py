"""Claim 12: a chat that resends its history pays for it again every turn; a cached prefix does not.

Both strategies are timed end to end, as a user waits for them: the wall time of each turn's call, the reply
included, after an untimed warm-up chat of each; the two alternate in order over the repeats. The prompt tokens
each strategy processes are counted too, but that count is a sum of history lengths (bookkeeping, the model).
"""
import time

import torch

from attnlab.config import preset
from attnlab.engine import SamplingParams
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.quantize import set_precision
from attnlab.experiments.base import (Decision, Outcome, Plot, Series, condition, fit_exponent, in_regime, over_repeats,
                                      verdict)
from attnlab.models import build_model

TITLE = "Long chats get expensive"
CLAIM = "A k-turn conversation that resends its whole history costs O(k^2) prompt processing; reusing the cached prefix costs O(k)."
PREDICTION = ("Cumulative prefill tokens grow quadratically in turns when history is resent, linearly with prefix "
              "reuse; measured end to end, replies included, the reuse strategy's cumulative time is lower by the "
              "last turn, by a margin that grows with the turns.")
THRESHOLD = ("Each of >= 3 repetitions (one resend chat and one reuse chat, alternating which runs first) is "
             "decided alone: supported if the cumulative end-to-end time by the last turn (replies included, after a "
             "warm-up) is >= 1.25x lower with prefix reuse than with resending, and that gain is larger at the last "
             "turn than at the middle one (the margin grows with the turns); not supported if the gain is below "
             "1.25x (or reuse is slower) or does not grow from the middle turn to the last. Repetitions that disagree "
             "make the verdict inconclusive (unstable). The resent-token exponent is bookkeeping (model), not in the "
             "verdict; the verdict under the original threshold (>= 2x end-to-end) is shown beside it.")
THRESHOLD_OLD = ("Each of >= 3 repetitions (one resend chat and one reuse chat, alternating which runs first) is "
                 "decided alone: supported if the cumulative end-to-end time by the last turn (replies included, after "
                 "a warm-up) is >= 1.25x lower with prefix reuse than with resending; not supported if the gain is "
                 "below 1.25x (or reuse is slower). Repetitions that disagree make the verdict inconclusive (unstable). "
                 "The resent-token exponent is bookkeeping (model), not in the verdict; the verdict under the original "
                 "threshold (>= 2x end-to-end) is shown beside it.")
REGIME = ("A chat long enough that resending the history dominates: at least 8 turns, the last turn's history at "
          "least 8x one turn's new user tokens; and prefix reuse actually in effect (the reuse chat processes at most "
          "half the prompt tokens the resend chat does, counted by the engine's prefix cache).")
ORIGINAL_GAIN = 2.0  # the first threshold (its CHANGES entry): reuse >= 2x faster in total at the last turn
CHANGES = [
    {"date": "2026-11-29", "what": "threshold and method: the time compared became prompt processing only (TTFT)",
     "old": "Supported if resent prefill tokens grow with exponent >= 1.5 in k and reuse is >= 2x faster in total at "
            "the last turn.",
     "new": ("Supported if resent prefill tokens grow with exponent >= 1.5 in k and the cumulative prompt-processing "
             "time (time to first token) with reuse is >= 2x lower by the last turn."),
     "why": ("Made in commit 2baeb00 (2026-11-29) without an entry here; recorded on 2026-12-02 (issue 29). The "
             "stated reason was that replies cost the same either way, so timing them diluted the gain. It moved the "
             "measure to the part of the turn the cache speeds up, after the end-to-end form had been run; the "
             "2026-11-30 entry below moved it back to end to end, with the bar lowered to 1.25x. One reference run "
             "(978a449, 2026-11-30) measured 1.82x end to end: supported under the current threshold, not under the "
             "original 2x; the page shows both.")},
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
    {"date": "2026-12-02", "what": "method: >= 3 repetitions decided one by one; a regime; the original threshold shown",
     "old": ("Supported if the cumulative end-to-end time by the last turn ... is lower with prefix reuse than with "
             "resending by more than the spread over repeats and by >= 1.25x; ... inconclusive if the difference is "
             "within the spread."),
     "new": THRESHOLD,
     "why": ("Issue 29: every verdict from >= 3 independent repetitions that must agree (inconclusive (unstable) "
             "otherwise), a regime checked from the measurements (prefix reuse really in effect, a chat long enough), "
             "and the verdict under the first threshold (>= 2x end to end) beside the current one, since the bar was "
             "lowered after measuring.")},
]
CHANGES.append(
    {"date": "2026-12-05", "what": "threshold: the prediction's 'by a margin that grows with the turns' decided",
     "old": THRESHOLD_OLD, "new": THRESHOLD,
     "why": ("Issue 29's independent read: the prediction says the gain grows with the turns (the O(k^2) against "
             "O(k) of the claim) and the threshold decided only the last turn's gain. Now each repetition's gain at "
             "the last turn must exceed its gain at the middle turn. Verdict before: supported (679adec, 3 of 3: "
             "2.13x, 2.13x, 1.95x at turn 20); after, on the same data: inconclusive (each repetition's times by turn "
             "were not kept then; the medians over repetitions read 1.60x at turn 10 -> 2.13x at turn 20, which "
             "would pass).")})

EST_S = {"quick": 6, "full": 15}  # seconds on a 2-core CPU: the report's progress estimate
MIN_GAIN, REPEATS = 1.25, 3


def _chat(model, turns, user, reply, reuse):
    """[(turn, cumulative prompt tokens processed, cumulative end-to-end seconds)] for one conversation."""
    engine = Engine(model, EngineConfig(prefix_reuse=reuse))
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
            "last_history_tokens": turns * user + (turns - 1) * reply,
            "prompt_tokens_by_repeat": {name: [rep[-1][1] for rep in rs] for name, rs in runs.items()},
            "cumulative_s": cum_s, "total_s_by_repeat": {name: [rep[-1][2] for rep in rs] for name, rs in runs.items()},
            "cumulative_s_by_repeat": {name: [[r[2] for r in rep] for rep in rs] for name, rs in runs.items()},
            "resent_token_exponent": fit_exponent(ks[1:], tokens["resend"][1:])}


def _regime(m: dict, i: int) -> list[dict]:
    tok = m["prompt_tokens_by_repeat"]
    share = tok["reuse"][i] / tok["resend"][i]
    turns, per_turn = m["turns"], m["last_history_tokens"] / m["user_tokens"]
    return [condition("turns", turns, ">= 8", turns >= 8),
            condition("last history / one turn's user tokens", per_turn, ">= 8", per_turn >= 8, f"{per_turn:.1f}x"),
            condition("prompt tokens processed, reuse / resend", share, "<= 0.5 (prefix reuse in effect)",
                      share <= 0.5, f"{share:.2f}")]


def _one(resend: float, reuse: float, turns: int, half_gain: float | None = None) -> Decision:
    """One repetition: the gain at the last turn against MIN_GAIN and (where measured) against the gain at the middle
    turn, ``half_gain``."""
    gain = resend / reuse
    grows = None if half_gain is None else gain > half_gain
    ok = False if gain < MIN_GAIN or grows is False else (None if grows is None else True)
    return Decision(verdict(ok), f"{gain:.2f}x", [
        f"cumulative end-to-end time after {turns} turns: resend {resend:.2f} s, reuse {reuse:.2f} s: gain {gain:.2f}x "
        f">= {MIN_GAIN}x: {'yes' if gain >= MIN_GAIN else 'no'}; "
        + (f"above the gain at turn {turns // 2} ({half_gain:.2f}x): {'yes' if grows else 'no'}"
           if half_gain is not None else "its growth from the middle turn: not recorded in this run (inconclusive)")])


def original_verdict(m: dict) -> dict:
    """The verdict under the first threshold (resent tokens' exponent >= 1.5 and >= 2x end to end), per repetition."""
    exp = m.get("resent_token_exponent")
    gains = [a / b for a, b in zip(m["total_s_by_repeat"]["resend"], m["total_s_by_repeat"]["reuse"])]
    each = [verdict(exp is not None and exp >= 1.5 and g >= ORIGINAL_GAIN) for g in gains]
    return {"threshold": f"resent tokens' exponent >= 1.5 and >= {ORIGINAL_GAIN:g}x end to end", "gains": gains,
            "repeats": each, "verdict": each[0] if len(set(each)) == 1 else "inconclusive (unstable)"}


def decide(measured: dict) -> Decision:
    resend, reuse = measured["total_s_by_repeat"]["resend"], measured["total_s_by_repeat"]["reuse"]
    turns = measured["turns"]
    by_rep = measured.get("cumulative_s_by_repeat")
    half = ([a[turns // 2 - 1] / b[turns // 2 - 1] for a, b in zip(by_rep["resend"], by_rep["reuse"])] if by_rep
            else [None] * len(resend))
    d = over_repeats([in_regime(_regime(measured, i), _one(a, b, turns, half[i]))
                      for i, (a, b) in enumerate(zip(resend, reuse))])
    gains = sorted(a / b for a, b in zip(resend, reuse))
    mid = gains[len(gains) // 2]
    orig = original_verdict(measured)
    reasons = list(d.reasons) + [
        f"under the original threshold ({orig['threshold']}): " + ", ".join(f"{g:.2f}x" for g in orig["gains"])
        + f" -> {orig['verdict']} (current threshold >= {MIN_GAIN}x: {d.label})"]
    exp = measured.get("resent_token_exponent")
    tok = measured.get("prompt_tokens", {})
    if exp is not None:
        reasons.append(f"model (not in the verdict): resent prompt tokens grow as k^{exp:.2f}")
    figure = (f"after {turns} turns: {mid:.2f}x less end-to-end time with the cached prefix (median of {len(gains)}, "
              f"range {gains[0]:.2f}-{gains[-1]:.2f}x; replies included)"
              + (f"; {tok['resend'][-1]:,} vs {tok['reuse'][-1]:,} prompt tokens processed" if tok else ""))
    return Decision(d.verdict, figure, reasons, d.qualifier, d.regime, d.repeats)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    ks, tok, cum = m["ks"], m["prompt_tokens"], m["cumulative_s"]
    rows = [{"turn": k, "resend_prefill_tokens": tok["resend"][i], "reuse_prefill_tokens": tok["reuse"][i],
             "resend_s": cum["resend"][i], "reuse_s": cum["reuse"][i]} for i, k in enumerate(ks)]
    m["original_threshold"] = original_verdict(m)
    return Outcome.of(decide(m), m,
                      [Plot("Cumulative prompt tokens processed (bookkeeping)", "turn", "tokens",
                            [Series("resend history", ks, tok["resend"]), Series("reuse cached prefix", ks, tok["reuse"])]),
                       Plot("Cumulative end-to-end time, replies included", "turn", "seconds",
                            [Series("resend history", ks, cum["resend"]), Series("reuse cached prefix", ks, cum["reuse"])])],
                      rows,
                      [f"Each turn adds {m['user_tokens']} user tokens and generates {m['reply_tokens']}; a "
                       "~10M-parameter model with random weights.",
                       f"Times: {REPEATS} repetitions, alternating which strategy runs first, after one untimed "
                       "2-turn chat of each; the plot shows the median.",
                       f"Original threshold (before 2026-11-30): >= {ORIGINAL_GAIN:g}x end to end; verdict under it: "
                       f"{m['original_threshold']['verdict']}."])

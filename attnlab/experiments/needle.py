"""Facts planted in real text, and the probes that claims 14, 15 and 16 measure with (the models they probe:
needle_training.py).

A probe builds sequences from corpus text it is given (the claims': the held-out split of the embedded corpus,
Python's standard library; the training's checks: the training split): ``k`` facts of one fixed form,
``code_qx = 4817``, planted at line starts of a window of text, then the query ``code_qx = `` asking one of them
again. The asked fact (the needle) sits at a chosen depth, beside ``n_facts - 1`` distractors of the same form drawn
from the same key and value distribution (no vocabulary of their own: the model must read the key to tell them
apart), in contexts from short to beyond the trained length. Accuracy is that of the first answer digit, the step
that must find the fact by its key (all four digits right, what greedy decoding would write, is recorded beside it);
the attention weight is the one the position before the first digit puts on the needle's line, per layer and head.
"""
from __future__ import annotations

import math

import torch

from attnlab.data.synthetic import IGNORE
from attnlab.errors import DataError
from attnlab.experiments.base import Decision, over_repeats

KEY_PREFIX, LETTERS, DIGITS = "code_", "abcdefghijklmnopqrstuvwxyz", 4
LEARNED = 0.8  # baseline accuracy (short context, no distractors) at which the model counts as having learned
Z = 2.0  # a difference counts when it clears its margin by this many standard errors


def fact_line(key: str, value: str) -> bytes:
    return f"{key} = {value}\n".encode()


def query_line(key: str) -> bytes:
    return f"{key} = ".encode()


def draw_facts(n: int, g: torch.Generator) -> list[tuple[str, str]]:
    """``n`` facts with distinct keys ``code_`` + two letters and four uniform digits; the first is the needle."""
    if not 1 <= n <= len(LETTERS) ** 2:
        raise DataError(f"a probe needs between 1 and {len(LETTERS) ** 2} facts, got {n}")
    idx = torch.randperm(len(LETTERS) ** 2, generator=g)[:n].tolist()
    digits = torch.randint(0, 10, (n, DIGITS), generator=g).tolist()
    return [(KEY_PREFIX + LETTERS[i // 26] + LETTERS[i % 26], "".join(map(str, d))) for i, d in zip(idx, digits)]


def min_length(n_facts: int, asked: int = 1) -> int:
    """The shortest probe with ``n_facts`` facts and ``asked`` questions: fact lines, queries, answers, no haystack."""
    return (n_facts * len(fact_line("code_aa", "0" * DIGITS)) + asked * (len(query_line("code_aa")) + DIGITS)
            + asked - 2)


def haystack(text: bytes, size: int, g: torch.Generator) -> bytes:
    """``size`` bytes of ``text`` from a random line start, ending in a newline (so a fact can follow)."""
    if size <= 0:
        return b""
    if len(text) < 2 * size + 2:
        raise DataError(f"the text has {len(text)} bytes, too few for a haystack of {size}")
    start = int(torch.randint(0, len(text) - 2 * size - 1, (1,), generator=g))
    start = text.find(b"\n", start, start + size) + 1 or start  # a line start, when one is near
    return text[start:start + size - 1] + b"\n"


def plant(text: bytes, length: int, n_facts: int, g: torch.Generator, depth: float | None = None, asked: int = 1):
    """One probe of ``length + 1`` bytes: haystack with the facts at line starts, the query, the answer.

    ``depth`` in [0, 1] puts the needle at the line start nearest that fraction of the haystack (0: before
    all text, 1: just before the query); None draws it like the distractors, uniformly over line starts.
    ``asked`` > 1 (training only) asks that many of the facts, one query line each, the needle's first, so a
    sequence carries more answers to learn from. Returns (sequence, info) with info "needle" and "distractors"
    as (start, end) byte spans, "depth" the needle's start over the bytes before it could go, "answers" the
    positions of every answer digit in the sequence."""
    facts = draw_facts(n_facts, g)
    lines = [fact_line(k, v) for k, v in facts]
    size = length + 1 - min_length(n_facts, asked) - 1
    if size < 0:
        raise DataError(f"a probe with {n_facts} facts and {asked} questions needs length >= "
                        f"{min_length(n_facts, asked)}, got {length}")
    hay = haystack(text, size, g)
    starts = [0] + [i + 1 for i, c in enumerate(hay) if c == 10]
    if depth is None:
        needle_at = starts[int(torch.randint(0, len(starts), (1,), generator=g))]
    else:
        needle_at = min(starts, key=lambda s: abs(s - depth * len(hay)))
    # (place, tie-break, line index): at a shared line start the needle goes first for depth < 0.5, last above
    ties = torch.rand(n_facts, generator=g).tolist()
    slots = [(needle_at, ties[0] if depth is None else depth, 0)]
    slots += [(starts[int(torch.randint(0, len(starts), (1,), generator=g))], ties[i], i) for i in range(1, n_facts)]
    out, spans, cursor = bytearray(), {}, 0
    for at, _, i in sorted(slots):
        out += hay[cursor:at]
        cursor = at
        spans[i] = (len(out), len(out) + len(lines[i]))
        out += lines[i]
    out += hay[cursor:]
    body = len(out) - len(lines[0])
    info = {"needle": spans[0], "distractors": [spans[i] for i in range(1, n_facts)],
            "depth": spans[0][0] / body if body else 0.5, "facts": facts, "answers": []}
    order = [0] + (torch.randperm(asked - 1, generator=g) + 1).tolist() if asked > 1 else [0]
    for j, i in enumerate(order):
        out += (b"\n" if j else b"") + query_line(facts[i][0])
        info["answers"] += range(len(out), len(out) + DIGITS)
        out += facts[i][1].encode()
    assert len(out) == length + 1, (len(out), length)
    return bytes(out), info


def needle_batch(text: bytes, n: int, length: int, n_facts: int, g: torch.Generator, depth: float | None = None,
                 asked: int = 1):
    """``n`` probes: x (n, length) byte ids, y (n, length) the answer digits where they are predicted and IGNORE
    elsewhere (with one question: the last DIGITS positions), and each probe's info (see ``plant``)."""
    seqs, infos = zip(*(plant(text, length, n_facts, g, depth, asked) for _ in range(n)))
    seq = torch.tensor([list(s) for s in seqs], dtype=torch.long)  # (n, length + 1)
    x, y = seq[:, :-1], torch.full((n, length), IGNORE, dtype=torch.long)
    for b, info in enumerate(infos):
        at = torch.tensor(info["answers"])
        y[b, at - 1] = seq[b, at]  # position t predicts byte t + 1
    return x, y, list(infos)


def _span_weight(row: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """row (H, T): the weight on the union of ``spans``, per head -> (H,)."""
    mask = torch.zeros(row.shape[-1], dtype=torch.bool)
    for a, b in spans:
        mask[a:b] = True
    return row[:, mask].sum(-1)


@torch.no_grad()
def probe(model, text: bytes, n: int, length: int, n_facts: int, seed: int, device: str, depth: float | None = None,
          weight_n: int = 0) -> dict:
    """Accuracy of ``n`` probes, and for the first ``weight_n`` the attention weight, per layer and head, that the
    position before the first answer digit puts on the needle's line and on the distractors' lines.

    "acc" scores the first answer digit: the one step that must find the fact by its key (uniform over ten digits,
    as are the distractors' first digits). The later digits can be copied from the first one's neighbours, a
    different skill; whether all four are right is "exact"."""
    from attnlab.experiments.recall import attention_maps

    x, y, infos = needle_batch(text, n, length, n_facts, torch.Generator().manual_seed(seed), depth)
    chunk = max(1, 8192 // length)
    first, exact = [], []
    for i in range(0, n, chunk):
        right = model(x[i:i + chunk].to(device))[0][:, -DIGITS:].argmax(-1).cpu() == y[i:i + chunk, -DIGITS:]
        first += right[:, 0].tolist()
        exact += right.all(-1).tolist()
    row = length - DIGITS  # predicts the first digit: the step that must find the needle
    on_needle, on_rest = [], []
    for i in range(0, weight_n, max(1, 4096 // length)):
        maps = attention_maps(model, x[i:min(weight_n, i + max(1, 4096 // length))].to(device))
        for b in range(maps[0].shape[0]):
            info = infos[i + b]
            rows = [m[b, :, row].cpu() for m in maps]  # [(H, T)] per layer
            on_needle.append(torch.stack([_span_weight(r, [info["needle"]]) for r in rows]))  # (L, H)
            on_rest.append(torch.stack([_span_weight(r, info["distractors"]) for r in rows]))
    out = {"acc": sum(first) / n, "exact": sum(exact) / n, "n": n, "tokens": length, "facts": n_facts,
           "depth": sum(i["depth"] for i in infos) / n}
    if on_needle:
        w = torch.stack(on_needle)  # (weight_n, L, H)
        sd = w.std(0) if len(w) > 1 else torch.zeros_like(w[0])
        out.update(weight=w.mean(0).tolist(), weight_sd=sd.tolist(), weight_n=len(w),
                   distractor_weight=torch.stack(on_rest).mean(0).tolist())
    return out


def learned_probes(t: dict, seed: int, device: str) -> dict:
    """The two probes that say whether the model (``t``: for_repetition's) learned the task: the fact alone in a short
    context (a quarter of the trained length), and the fact beside one look-alike at the trained length."""
    s = t["setup"]
    return {"base": probe(t["model"], t["text"], s.probe_n, s.train_len // 4, 1, seed, device),
            "pair": probe(t["model"], t["text"], s.probe_n, s.train_len, 2, seed + 50, device)}


def learned_conditions(base: dict, pair: dict) -> list[dict]:
    """The regime every claim of 14-16 needs: the model finds the fact alone, and tells it from one look-alike (a model
    that copies whichever fact it meets scores about 50% there, and any distractor then "dilutes" it trivially)."""
    from attnlab.experiments.base import condition

    return [condition("accuracy, fact alone", base["acc"], f">= {LEARNED:.0%} (the task was learned)",
                      base["acc"] >= LEARNED, f"{base['acc']:.0%}"),
            condition("accuracy, fact beside one look-alike", pair["acc"],
                      f">= {LEARNED:.0%} (it reads the key)", pair["acc"] >= LEARNED, f"{pair['acc']:.0%}")]


def tracked_head(base: dict) -> tuple[int, int]:
    """The (layer, head) that puts the most weight on the needle in the baseline probe: the head followed across
    conditions, chosen before they are looked at."""
    w = base["weight"]
    return max(((l, h) for l in range(len(w)) for h in range(len(w[l]))), key=lambda lh: w[lh[0]][lh[1]])


def head_weight(p: dict, lh) -> tuple[float, float, int]:
    """(mean, standard error) of the tracked head's weight on the needle in probe ``p``, and its sample count."""
    l, h = lh
    return p["weight"][l][h], p["weight_sd"][l][h] / math.sqrt(max(1, p["weight_n"])), p["weight_n"]


def acc_se(p: dict) -> float:
    """Binomial standard error of a probe's accuracy (at least that of one success or failure in n)."""
    a, n = p["acc"], p["n"]
    a = min(max(a, 1 / n), 1 - 1 / n)
    return math.sqrt(a * (1 - a) / n)


def over_repetitions(decisions: list[Decision], seeds: list | None = None) -> Decision:
    """base.over_repeats, with every repetition's own checks kept in the reasons (over_repeats quotes only the last
    deciding one), each under the seed of the model it probed (``seeds``, one per repetition, None where unrecorded)."""
    out = over_repeats(decisions)
    seeds = seeds or [None] * len(decisions)
    if len(decisions) > 1:
        out.reasons += [f"repetition {i + 1}" + ("" if seed is None else f" (model seed {seed})") + f": {r}"
                        for i, (d, seed) in enumerate(zip(decisions, seeds)) for r in d.reasons]
    else:
        out.reasons = list(decisions[0].reasons) + out.reasons
    return out


def cleared(result: bool | None) -> str:
    """beyond()'s answer in words, for a repetition's deciding line."""
    return {True: "clears its margin", False: "falls short of its margin"}.get(result, "is within noise of its margin")


def beyond(value: float, margin: float, se: float) -> bool | None:
    """Does ``value`` clear ``margin`` by more than Z standard errors (True), fall short of it by more (False), or
    lie within them (None)? Pure: decide() uses it."""
    if value - margin > Z * se:
        return True
    if margin - value > Z * se:
        return False
    return None

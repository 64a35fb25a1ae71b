"""Facts planted in real text: the needle-in-a-haystack model and probes that claims 14, 15 and 16 measure.

A byte-level language model is trained on the embedded corpus (Python's standard library) and on retrieval
sequences: ``k`` facts of one fixed form, ``code_qx = 4817``, planted at line starts of a window of training
text, then queries ``code_qx = `` asking some of them again; the loss is on the answer digits only. Training
runs in two phases (``_batches``): first only dense sequences (four facts side by side, all four asked), then
dense sequences, facts in corpus text at every length up to the trained one, and plain corpus text, mixed.

The probes build the same sequences from the held-out split: the asked fact (the needle) at a chosen depth,
``n_facts - 1`` distractors of the same form drawn from the same key and value distribution (no vocabulary of
their own: the model must read the key to tell them apart), and contexts from short to beyond the trained length.
Accuracy is that of the first answer digit, the step that must find the fact by its key
(all four digits right, what greedy decoding would write, is recorded beside it); the attention weight is the
one the position before the first digit puts on the needle's line, per layer and head.

One model is trained per repetition (its own seed: initial weights and batch order; 3 at full scale) once per
(scale, device), and shared by the three claims within one report process: repetition r of every claim probes model
r, so the claims' repetitions are independent trainings.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.synthetic import IGNORE
from attnlab.data.tasks import make_task, step_generator
from attnlab.errors import DataError
from attnlab.experiments.base import Decision, over_repeats
from attnlab.experiments.training import LONG, Job, run_tasks, workers_for
from attnlab.models import build_model
from attnlab.fit import evaluate, train_in_memory

KEY_PREFIX, LETTERS, DIGITS = "code_", "abcdefghijklmnopqrstuvwxyz", 4
LEARNED = 0.8  # baseline accuracy (short context, no distractors) at which the model counts as having learned
Z = 2.0  # a difference counts when it clears its margin by this many standard errors


@dataclass(frozen=True)
class Setup:
    train_len: int  # L: bytes per training sequence; probes go to 4L
    dim: int
    n_layers: int
    n_heads: int
    dense_steps: int  # phase 1, at most: dense sequences only (DENSE_FACTS facts, all asked) until the lookup is learned
    steps: int  # phase 2: dense sequences, facts in text and corpus windows, mixed
    batch: int  # phase 2's sequences per step
    dense_batch: int  # phase 1's (needle_changes.BATCH_WHY: the lookup forms in fewer steps of half the batch)
    lr: float
    max_facts: int  # facts per haystack training sequence: 2..max_facts
    max_asked: int  # questions per haystack training sequence (probes ask one)
    probe_n: int  # probes per condition and repetition
    weight_n: int  # of which this many also have their attention maps read
    repeats: int
    attempts: int = 1  # initialisations tried, at most, for a first phase that does not leave the plateau
    plateau_steps: int = 0  # an attempt but the last still on the plateau (below LEAVING) here starts again


# The full setup learns to read the key (>= 80% beside look-alikes at the trained length); the quick one is too short
# to (its verdicts read "regime not reached"). Two layers learned it where three, at the same steps, did not: the
# lookup needs one layer to gather the key's letters and one to match them.
SETUPS = {
    "quick": Setup(train_len=128, dim=64, n_layers=2, n_heads=4, dense_steps=100, steps=50, batch=16, dense_batch=16,
                   lr=3e-3, max_facts=5, max_asked=3, probe_n=48, weight_n=8, repeats=1),
    "full": Setup(train_len=128, dim=128, n_layers=2, n_heads=8, dense_steps=6000, steps=1500, batch=32,
                  dense_batch=16, lr=1e-3, max_facts=5, max_asked=3, probe_n=480, weight_n=64, repeats=3, attempts=3,
                  plateau_steps=4000),
}
DENSE_FACTS = 4  # facts in a dense training sequence, every one asked
DENSE_SLACK = 8  # haystack bytes a dense sequence may carry at most
# Phase 1 ends when dense probes (training text, DENSE_FACTS facts, one asked) score DENSE_LEARNED, checked every
# CHECK_EVERY steps: when the lookup forms varies with the initialisation, so a fixed length either wastes steps or
# stops before it.
DENSE_LEARNED, CHECK_EVERY, CHECK_N = 0.9, 250, 64
# Attempt a of seed s starts from initialisation s + 100 a, its batches from streams 10 (s + 100 a) + phase (corpus
# windows 0, dense 1, mixed 2): no two (seed, attempt, phase) share a stream.
RESTART_STRIDE, STREAMS = 100, 10
# Dense probes at or above this have left the plateau (which reads 25-56%: copying any of the four facts scores 25%):
# an attempt climbing past it at plateau_steps is let run on to dense_steps.
LEAVING = 0.6


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


# Untied embeddings and a wider init, as recall.py found for MQAR: with the language-model defaults (tied, std 0.02)
# the answer loss sat at chance (ln 10 per digit) where this recipe had started to retrieve.
MODEL_RECIPE = dict(tie_embeddings=False, init_std=0.07)


def _model_config(s: Setup) -> ModelConfig:
    return ModelConfig(vocab_size=256, dim=s.dim, n_layers=s.n_layers, n_heads=s.n_heads, max_seq_len=4 * s.train_len,
                       **MODEL_RECIPE)


def _batches(task, text: bytes, s: Setup):
    """(step, phase) -> (x, y). Phase 1: dense sequences only, DENSE_FACTS facts side by side and every one asked, loss
    on the answer digits. Phase 2: odd steps dense; of the even ones, half plain corpus windows (next-byte
    loss everywhere) and half 2..max_facts facts planted in corpus text of any length up to the trained one, up to
    max_asked of them asked.

    Why the curriculum: trained from the start on facts in text (one to five, a few asked), the model learns to copy
    whichever fact it meets and never to read the key (claim 14's CHANGES has the variants tried). Dense sequences make
    that shortcut pay 1 in 4 and put many answers in each sequence, so the key-reading mechanism forms there; the mixed
    phase then carries it across corpus text."""
    dense_len = min_length(DENSE_FACTS, DENSE_FACTS)

    def batch(step: int, phase: int = 2):
        g = step_generator(task.cfg.seed + phase, step)
        if phase == 1 or step % 2:
            length = int(torch.randint(dense_len, dense_len + DENSE_SLACK + 1, (1,), generator=g))
            x, y, _ = needle_batch(text, s.dense_batch if phase == 1 else s.batch, length, DENSE_FACTS, g,
                                   asked=DENSE_FACTS)
            return x, y
        if step % 4 == 0:
            return task.batch(step)
        k = int(torch.randint(2, s.max_facts + 1, (1,), generator=g))
        asked = min(k, s.max_asked)
        length = int(torch.randint(min_length(k, asked), s.train_len + 1, (1,), generator=g))
        x, y, _ = needle_batch(text, s.batch, length, k, g, asked=asked)
        return x, y
    return batch


def _train_config(s: Setup, seed: int = 0) -> TrainConfig:
    return TrainConfig(seq_len=s.train_len, batch_size=s.batch, steps=s.steps, warmup_steps=max(1, s.steps // 10),
                       lr=s.lr, eval_batches=4, corpus_max_bytes=3_000_000, seed=seed)


def _dense_phase(s: Setup, device: str, init: int, last: bool = True):
    """Phase 1 from initialisation ``init`` (the model's weights and the order of its batches): (model, the task and
    its batches, what the phase did: {"init", "steps", "learned", "checks" [(steps done, dense-probe accuracy)]}). It
    ends when the lookup is learned, after dense_steps, or (``last`` False) at plateau_steps if its dense probes are
    still below LEAVING there, to start again. The learning rate's schedule spans dense_steps in every attempt."""
    tc = _train_config(s, STREAMS * init)
    task = make_task(tc)
    train_text = bytes(task.train_ids.numpy())
    batch = _batches(task, train_text, s)
    torch.manual_seed(init)
    model = build_model(_model_config(s), device)
    checks = []
    check_len = min_length(DENSE_FACTS) + DENSE_SLACK

    def learned(done: int) -> bool:
        if done % CHECK_EVERY:
            return False
        model.eval()
        checks.append((done, probe(model, train_text, CHECK_N, check_len, DENSE_FACTS, 7000 + done, device)["acc"]))
        model.train()
        return checks[-1][1] >= DENSE_LEARNED

    ran = 0

    def stop(done: int) -> bool:
        nonlocal ran
        ran = done
        if learned(done):
            return True
        # an attempt but the last still on the plateau where it may give up: start again
        return not last and done == s.plateau_steps and not done % CHECK_EVERY and checks[-1][1] < LEAVING

    dense = replace(tc, steps=s.dense_steps, warmup_steps=max(1, min(200, s.dense_steps // 10)))
    train_in_memory(model, lambda step: tuple(t.to(device) for t in batch(step, 1)), dense, until=stop)
    ok = bool(checks) and checks[-1][1] >= DENSE_LEARNED
    return model, (tc, batch), {"init": init, "steps": ran, "learned": ok, "checks": checks}


def _train_job(s: Setup, device: str, seed: int = 0) -> dict:
    """Train the model of ``seed``, as the training stage runs it (training.py): {"weights" (plain tensors),
    "train_s", "dense_phase" (the attempt that went on: when its first phase ended, its checks; "attempts": every
    attempt's), "val_loss"}.

    An attempt whose first phase is still on the plateau at ``plateau_steps`` starts again from a new
    initialisation (``seed + RESTART_STRIDE * attempt``), up to ``attempts`` in all: when the lookup forms depends on
    the initialisation, and some never leave the plateau (needle_changes.SEEDS_WHY); the last attempt goes on to
    the second phase whether it learned or not, and the probes then say so."""
    need = max(min_length(s.max_facts, s.max_asked), min_length(DENSE_FACTS, DENSE_FACTS) + DENSE_SLACK)
    if need > s.train_len:
        raise DataError(f"{s.max_facts} facts and {s.max_asked} questions (and the dense sequences) need a trained "
                        f"length >= {need}, got {s.train_len}")
    t0 = time.perf_counter()
    attempts = []
    for attempt in range(s.attempts):
        model, (tc, batch), phase1 = _dense_phase(s, device, seed + RESTART_STRIDE * attempt, attempt == s.attempts - 1)
        attempts.append(phase1)
        if phase1["learned"]:
            break
    model = train_in_memory(model, lambda step: tuple(t.to(device) for t in batch(step)), tc)
    train_s = time.perf_counter() - t0
    held_out = make_task(_train_config(s)).eval_batches()  # one set for every seed (its draw follows the config's seed)
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "train_s": train_s,
            "dense_phase": {**attempts[-1], "attempts": attempts},
            "val_loss": evaluate(model, held_out, device)["val_loss"]}


_CACHE: dict = {}  # (scale, device) -> what trained() returns


def seeds(s: Setup) -> list[int]:
    """The seeds of the models trained for a setup: one per repetition (``repeats``: 3 at full scale), so the claims'
    repetitions are independent trainings, not rounds of probes on one model (whose quirks every round would share)."""
    return list(range(s.repeats))


def _model_task(scale: str, device: str):
    """The training-stage task (training.py): one long job per seed, then the models and the held-out text into the
    cache."""
    s = SETUPS[scale]
    outs = yield [Job(_train_job, (s, str(device), seed), LONG) for seed in seeds(s)]
    models = []
    for seed, out in zip(seeds(s), outs):
        model = build_model(_model_config(s), device)
        model.load_state_dict(out["weights"])
        models.append({"seed": seed, "model": model.eval(), "train_s": out["train_s"],
                       "dense_phase": out["dense_phase"], "val_bits_per_byte": out["val_loss"] / math.log(2)})
    task = make_task(_train_config(s))  # the held-out split is the same for every seed
    _CACHE[(scale, str(device))] = {"models": models, "text": bytes(task.val_ids.numpy()), "setup": s,
                                    "config": _model_config(s).to_dict(), "corpus": task.info}


def training_tasks(scale: str, device: str) -> dict:
    """The models' training, for the report's training stage, unless they are trained already; claims 14-16 share
    them."""
    key = (scale, str(device))
    return {} if key in _CACHE else {("needle",) + key: _model_task(scale, device)}


def trained(scale: str, device: str) -> dict:
    """The models, trained once per (scale, device) and shared by claims 14-16 (by the training stage, or here when
    a claim runs alone): {"models" (one per seed: {"seed", "model", "train_s", "dense_phase" (when the first phase
    ended, its checks), "val_bits_per_byte"}), "text" (held-out bytes the probes draw from), "setup", "config",
    "corpus"}. ``for_repetition`` picks a repetition's model."""
    run_tasks(training_tasks(scale, device).values(), workers_for(device))
    return _CACHE[(scale, str(device))]


def for_repetition(t: dict, r: int) -> dict:
    """What repetition ``r`` (from 0) probes: the model of its own seed, the held-out text and the setup."""
    if not 0 <= r < len(t["models"]):
        raise ValueError(f"repetition {r + 1} has no model of its own: {len(t['models'])} trained (Setup.repeats)")
    m = t["models"][r]
    return {"model": m["model"], "seed": m["seed"], "text": t["text"], "setup": t["setup"]}


def summary(scale: str, device: str) -> dict:
    """What goes into results.json about the shared models: everything but the models and the text."""
    t = trained(scale, device)
    return {"setup": asdict(t["setup"]), "config": t["config"], "corpus": t["corpus"], "fact_form": "code_qx = 4817",
            "models": [{k: v for k, v in m.items() if k != "model"} for m in t["models"]]}


def models_line(summary_: dict, train_len: int) -> str:
    """The models in one caveat line; results written before one model per repetition say that one model served
    every repetition."""
    c = summary_["config"]
    if "models" not in summary_:
        return (f"Model: {c['n_layers']} layers, width {c['dim']}, trained {summary_['train_s']:.0f} s at {train_len} "
                f"bytes, one model for every repetition; held-out {summary_['val_bits_per_byte']:.2f} bits per byte.")
    ms = summary_["models"]
    tried = lambda m: len(m.get("dense_phase", {}).get("attempts", ())) or 1
    each = "; ".join(f"seed {m['seed']}: trained {m['train_s']:.0f} s"
                     + (f" ({tried(m)} initialisations tried, the last one kept)" if tried(m) > 1 else "")
                     + f", held-out {m['val_bits_per_byte']:.2f} bits per byte" for m in ms)
    return f"Models: {c['n_layers']} layers, width {c['dim']}, at {train_len} bytes, one per repetition ({each})."


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

"""Claim 14: a softmax spreads a fixed budget of attention, so irrelevant text and same-form distractors thin out the
weight on the relevant fact (probed with facts planted in real text: needle.py)."""
from attnlab.experiments import needle, needle_changes, needle_training
from attnlab.experiments.base import (FULL_REPEATS, Decision, Outcome, Plot, SHOWN, Series, condition, in_regime,
                                      mean, verdict)

TITLE = "Attention is a fixed budget"
CLAIM = ("Attention weights sum to one, so every irrelevant token added to the context takes some weight from the "
         "relevant one: as irrelevant text and look-alike facts are added, the weight on the relevant fact and the "
         "answer's accuracy fall.")
PREDICTION = ("On a byte-level language model trained on the embedded corpus with facts planted in it (needle.py), "
              "asked for one fact of the form 'code_qx = 4817': from a short context with no other fact (a quarter of "
              "the trained length) to the trained length with the most same-form distractors it was trained with, the "
              "weight its most needle-attending head (chosen on the short context) puts on the fact's line falls by "
              ">= 10% (relative) and the accuracy on the answer's first digit (the step that finds the fact by its "
              "key) falls by >= 5 points.")
_THRESHOLD_BODY = ("Per repetition: supported if both falls exceed their margins (10% relative weight, 5 points "
                   "accuracy) by more than 2 standard errors; not supported if either falls short of its margin by "
                   "more than 2 standard errors; inconclusive otherwise.")
THRESHOLD = _THRESHOLD_BODY + " " + needle_training.REPETITIONS
REGIME = ("The model learned the task: first-digit accuracy >= 80% on the short context with no distractor, and >= 80% "
          "at the trained length beside one same-form distractor (it reads the key). The "
          "contexts reach the trained length, with >= 4 same-form distractors. (Lengths 2x and 4x the trained one are "
          "measured and shown, not decided: past the trained length a fall mixes dilution with unseen positions.)")
CHANGES = [
    {"date": "2026-12-02", "what": "method, prediction and regime: facts planted in real text replace the synthetic "
                                   "recall task",
     "old": ("The recall transformer of claim 3 (2 layers, 64 tokens), irrelevant tokens drawn from a vocabulary of "
             "their own, weight and accuracy from 0 to the most filler tokens it was trained with, over 3 seeds."),
     "new": PREDICTION + " " + _THRESHOLD_BODY + " " + needle_changes.DRAWS_REPETITIONS,
     "why": ("Issue 29: filler tokens from a separate vocabulary can be ignored by identity (the old run measured 100% "
             "accuracy and weight 0.93 -> 0.94 everywhere), so the old set-up could not show dilution and its 'not "
             "supported' said more about the set-up than the claim. Distractors now have the needle's form and "
             "distribution, the haystack is held-out corpus text, and the verdict stands only where the model "
             "learned the task.")},
    {"date": "2026-12-02", "what": "regime: the model must also tell the fact from one look-alike",
     "old": "Regime: first-digit accuracy >= 80% on the fact alone in a short context.",
     "new": ("Also >= 80% at the trained length with the fact beside one same-form distractor "
             "(needle.learned_conditions)."),
     "why": ("The first full run of the planted-fact design (before this entry) met the old regime (100% on the fact "
             "alone) but scored 50-55% with one look-alike: the model copied whichever fact it met, without reading "
             "the key, so any distractor 'diluted' it trivially and the position curve was a first-fact bias. "
             "Verdicts of that run: 14 supported, 15 not supported, 16 inconclusive; under this regime all three read "
             "'inconclusive (regime not reached)' until the model reads the key.")},
    needle_changes.training_change(needle_changes.TRAINING_AFTER, head=(
        ("; the tracked head picked on the measured baseline probes"),
        ("; the tracked head picked on baseline probes drawn for that alone"),
        (" Picking the head on the very probes it is then measured on favoured a fall (the top of a noisy "
         "ranking falls on any re-draw), so the pick has probes of its own."))),
    needle_changes.lr_change(
        "inconclusive (unstable): repetitions inconclusive, not supported, inconclusive (weight on the "
        "fact fell 7-11% against a 10% margin, accuracy 0.6-5.6 points against 5)"),
    {"date": "2026-12-03", "what": "method: the two decided conditions drawn with 10x the probes and 4x the attention "
                                   "maps",
     "old": "480 probes and 64 attention maps in every condition (full scale)",
     "new": ("4,800 probes and 256 attention maps in the baseline (32 bytes, no distractor) and in the decided "
             "condition (the trained length, 4 distractors); the conditions only shown keep 480 and 64"),
     "why": ("In the reference of 83d7463 the falls sat near their margins: accuracy 3.7, 2.9 and 4.6 points against 5 "
             "with 2 standard errors of 1.6-2.0, the weight 8, 8 and 10% against 10% with 2 s.e. of 5%. With a "
             "standard error as large as the distance to the margin, repetitions disagreed (inconclusive, not "
             "supported, inconclusive) and the verdict was no finding. Ten times the probes shrink the accuracy's "
             "standard error ~3.2x, four times the maps the weight's 2x, at ~10 s a repetition. Prediction, margins, "
             "threshold and regime unchanged. Verdict before: inconclusive (unstable) (reference 83d7463); after: the "
             "reference at this change.")},
    needle_changes.stage_change("not supported"),
    needle_changes.batch_change("inconclusive in 3 of 3 repetitions (the weight's fall 11-13% and the accuracy's "
                                "4.7-5.1 points, each within noise of its margin)"),
    needle_changes.seeds_change("inconclusive in 3 of 3 repetitions on one model (the weight's fall 9-13%, within "
                                "noise of its 10% margin)"),
    needle_changes.repetitions_change(_THRESHOLD_BODY + " " + needle_changes.DRAWS_REPETITIONS, THRESHOLD,
                                      "inconclusive (unstable): seeds 0 and 1 inconclusive, seed 2 not supported"),
    needle_changes.width_change("inconclusive (unstable): seeds 0 and 1 inconclusive, seed 2 not supported (the "
                                "weight's fall 9%, 13%, 7%; the accuracy's 5.9, 5.2, 4.3 points)",
                                "inconclusive (unstable): seeds 0 and 1 inconclusive, seed 2 not supported (the "
                                "weight's fall 14%, 11%, 12%; the accuracy's 4.7, 5.6, 2.5 points)"),
]
EST_S = {"quick": 2, "full": 60}  # seconds on a 2-core CPU, the training stage left out: the progress estimate
TRAIN_EST_S = {"quick": 17, "full": 500}  # this claim's share of the training stage (training.py), in seconds
# The two decided conditions (the baseline and the trained length with the most facts) draw this many times the
# setup's probes and attention maps: their falls sit near the margins, where a standard error as large as the
# distance to the margin lets repetitions disagree; the conditions only shown keep the setup's counts.
DECIDED_PROBES, DECIDED_MAPS = 10, 4


def conditions(s: needle_training.Setup) -> list[tuple[int, int]]:
    """(length, facts): the baseline, more facts at the trained length, then longer contexts with the most facts."""
    L, k = s.train_len, s.max_facts
    return [(L // 4, 1), (L, 1), (L, 2), (L, k), (2 * L, k), (4 * L, k)]


def _far_index(s: needle_training.Setup) -> int:
    """The decided condition's place in ``conditions``: the trained length with the most facts."""
    return conditions(s).index((s.train_len, s.max_facts))


def training(scale: str, device: str) -> dict:
    """The shared needle models (one per repetition), for the report's training stage (training.py)."""
    return needle_training.training_tasks(scale, device)


def measure(scale: str, device: str) -> dict:
    t = needle_training.trained(scale, device)
    s = t["setup"]
    reps = s.repeats if scale == "quick" else max(s.repeats, FULL_REPEATS)
    repeats = []
    for r in range(reps):
        m = needle_training.for_repetition(t, r)
        decided = {0, _far_index(s)}
        probes = [needle.probe(m["model"], t["text"], s.probe_n * (DECIDED_PROBES if i in decided else 1), length,
                               facts, 1400 + 100 * r + i, device,
                               weight_n=s.weight_n * (DECIDED_MAPS if i in decided else 1))
                  for i, (length, facts) in enumerate(conditions(s))]
        # The head is picked on baseline probes of their own: picked on the measured baseline, its weight there would
        # be the top of a noisy ranking and fall on any re-draw, a fall that favours the claim.
        length, facts = conditions(s)[0]
        pick = needle.probe(m["model"], t["text"], s.probe_n, length, facts, 1490 + 100 * r, device,
                            weight_n=s.weight_n)
        repeats.append({"model_seed": m["seed"], "probes": probes, "head": list(needle.tracked_head(pick))})
    return {"train_len": s.train_len, "max_facts": s.max_facts, "repeats": repeats,
            "model": needle_training.summary(scale, device)}


def _far(rep: dict, train_len: int) -> dict:
    """The decided condition: the trained length with the most facts."""
    return max((p for p in rep["probes"] if p["tokens"] == train_len), key=lambda p: p["facts"])


def decide_one(rep: dict, train_len: int) -> Decision:
    base, far = rep["probes"][0], _far(rep, train_len)
    (w0, se0, _), (w1, se1, _) = needle.head_weight(base, rep["head"]), needle.head_weight(far, rep["head"])
    fall_w = 1 - w1 / w0 if w0 > 0 else 0.0
    se_w = (w1 / w0) * ((se0 / w0) ** 2 + (se1 / w1 if w1 > 0 else 0.0) ** 2) ** 0.5 if w0 > 0 else 0.0
    fall_a = base["acc"] - far["acc"]
    se_a = (needle.acc_se(base) ** 2 + needle.acc_se(far) ** 2) ** 0.5
    w, a = needle.beyond(fall_w, 0.10, se_w), needle.beyond(fall_a, 0.05, se_a)
    reasons = [f"weight of layer {rep['head'][0]} head {rep['head'][1]} on the fact: {w0:.3f} -> {w1:.3f}, a fall of "
               f"{fall_w:.0%} (2 s.e. {2 * se_w:.0%}; >= 10%?)",
               f"accuracy: {base['acc']:.0%} ({base['tokens']} bytes, no distractor) -> {far['acc']:.0%} "
               f"({far['tokens']} bytes, {far['facts'] - 1} distractors), a fall of {fall_a * 100:.1f} points "
               f"(2 s.e. {2 * se_a * 100:.1f}; >= 5?)"]
    ok = False if w is False or a is False else None if w is None or a is None else True
    longest = max(rep["probes"], key=lambda p: p["tokens"])
    reasons.append(f"{SHOWN}: {longest['tokens']} bytes ({longest['tokens'] / train_len:.0f}x the trained "
                   f"length) with {longest['facts'] - 1} distractors: accuracy {longest['acc']:.0%}")
    # last: both checks in one line, the one a repetition's summary quotes (over_repeats)
    reasons.append(f"the weight's fall ({fall_w:.0%}) {needle.cleared(w)} of 10%, the accuracy's "
                   f"({fall_a * 100:.1f} points) {needle.cleared(a)} of 5 (2 standard errors)")
    figure = (f"{base['tokens']} -> {far['tokens']} bytes and 0 -> {far['facts'] - 1} look-alike facts: weight on the "
              f"fact {w0:.2f} -> {w1:.2f}, accuracy {base['acc']:.0%} -> {far['acc']:.0%}")
    return Decision(verdict(ok), figure, reasons)


def regime(rep: dict, train_len: int) -> list[dict]:
    base, far = rep["probes"][0], _far(rep, train_len)
    pair = next(p for p in rep["probes"] if p["tokens"] == train_len and p["facts"] == 2)
    return needle.learned_conditions(base, pair) + [
        condition("distractors at the trained length", far["facts"] - 1, ">= 4", far["facts"] - 1 >= 4)]


def decide(m: dict) -> Decision:
    L = m["train_len"]
    return needle.over_repetitions([in_regime(regime(rep, L), decide_one(rep, L)) for rep in m["repeats"]],
                                   [rep.get("model_seed") for rep in m["repeats"]])


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows = []
    for r, rep in enumerate(m["repeats"]):
        for p in rep["probes"]:
            w = needle.head_weight(p, rep["head"])[0]
            rows.append({"repetition": r + 1, "model_seed": rep.get("model_seed"), "bytes": p["tokens"],
                         "distractors": p["facts"] - 1, "accuracy": p["acc"], "all_4_digits": p["exact"],
                         "probes": p["n"], "weight_on_fact": w,
                         "weight_on_distractors": p["distractor_weight"][rep["head"][0]][rep["head"][1]]})
    conds = conditions(needle_training.SETUPS[scale])
    avg = lambda key: [mean([row[key] for row in rows if (row["bytes"], row["distractors"] + 1) == c]) for c in conds]
    labels = [f"{n}B/{k - 1}d" for n, k in conds]
    xs = list(range(len(conds)))
    caveats = [f"Conditions (x axis, bytes/distractors): {', '.join(labels)}. Each repetition draws new haystacks "
               "(held-out corpus text) and new facts, and probes a model of its own seed (needle_training.py), shared "
               "with claims 15 and 16.",
               needle_training.models_line(m["model"], m["train_len"])]
    return Outcome.of(decide(m), m, [
        Plot("Attention weight on the planted fact", "condition (see caveats)", "weight (tracked head)",
             [Series("on the fact", xs, avg("weight_on_fact")), Series("on the distractors", xs, avg("weight_on_distractors"))]),
        Plot("First-answer-digit accuracy", "condition (see caveats)", "accuracy", [Series("accuracy", xs, avg("accuracy"))])],
        rows, caveats)

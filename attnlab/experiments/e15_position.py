"""Claim 15: where the relevant item sits in a long context changes whether it is found."""
from attnlab.experiments import recall
from attnlab.experiments.base import Decision, Outcome, Plot, Series, exceeds, mean, spread, verdict

TITLE = "Put the instruction where it can win"
CLAIM = ("Models find what they need best at the start or the end of a long context and worst in the middle "
         "(\"lost in the middle\"), so where the relevant item is placed matters.")
PREDICTION = ("On the transformer trained for recall (claim 3's), with the most irrelevant tokens it was trained with, "
              "accuracy on the asked pair is lower when the pair sits in the middle of the context than at its start "
              "and at its end, by >= 5 points each.")
THRESHOLD = ("Supported if min(start, end) - middle exceeds 5 points by more than the seed spread; not supported if "
             "it falls short of 5 points by more than the spread; inconclusive if the model did not learn the task "
             "(< 80% accuracy at the end of the context) or the gap is within the spread of 5 points.")
CHANGES: list = []
PLACES = {"start": 0.0, "middle": 0.5, "end": 1.0}
EST_S = {"quick": 4, "full": 20}


def measure(scale: str, device: str) -> dict:
    setup = recall.SETUPS[scale]
    pairs = setup.test_pairs[len(setup.test_pairs) // 2]
    filler = setup.filler[1]
    models = recall.trained("transformer", scale, device)["models"]
    probes = {name: [recall.probe(m, setup, pairs, 2718, device, setup.test_n, filler=filler, place=at, n_queries=4)
                     for m in models] for name, at in PLACES.items()}
    return {"pairs": pairs, "filler": filler, "probes": probes, "recall_setup": recall.setup_dict(scale)}


def decide(m: dict) -> Decision:
    acc = {k: [p["acc"] for p in v] for k, v in m["probes"].items()}
    gap = [min(s, e) - mid for s, mid, e in zip(acc["start"], acc["middle"], acc["end"])]
    reasons = [f"accuracy at the end: {mean(acc['end']):.0%} (>= 80% means the task was learned)",
               "accuracy by position: " + ", ".join(f"{k} {mean(v):.1%}" for k, v in acc.items()),
               f"min(start, end) - middle: {mean(gap) * 100:.1f} points (spread {spread(gap) * 100:.1f}; >= 5?)"]
    g = exceeds(gap, 0.05)
    if mean(acc["end"]) < 0.8:
        ok = None
        reasons.append("the model did not learn the task: inconclusive")
    elif g is None:
        ok = None
        reasons.append("the gap is within the seed spread of 5 points: inconclusive")
    else:
        ok = g
    figure = "accuracy by position of the relevant pair: " + ", ".join(f"{k} {mean(v):.0%}" for k, v in acc.items())
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    names = list(PLACES)
    acc = [mean([p["acc"] for p in m["probes"][k]]) for k in names]
    weight = [mean([p["weight"] for p in m["probes"][k]]) for k in names]
    rows = [{"position": k, "place": PLACES[k], "accuracy": acc[i], "weight_on_relevant": weight[i]}
            for i, k in enumerate(names)]
    return Outcome.of(decide(m), m, [
        Plot("Accuracy vs position of the relevant pair", "place in the context (0 = start, 1 = end)", "accuracy",
             [Series("accuracy", list(PLACES.values()), acc), Series("weight on it", list(PLACES.values()), weight)])],
        rows, [f"{m['pairs']} key-value pairs among {m['filler']} irrelevant tokens; the asked pair is placed at the "
               "start, middle or end of that context and asked 4 times. A 2-layer model at this scale: 'lost in the "
               "middle' (Liu et al. 2023) was found in large models on long documents."])

"""Claim 14: a softmax spreads a fixed budget of attention, so irrelevant tokens thin out the relevant one."""
from attnlab.experiments import recall
from attnlab.experiments.base import Decision, Outcome, Plot, Series, exceeds, mean, spread, verdict

TITLE = "Attention is a fixed budget"
CLAIM = ("Attention weights sum to one, so every irrelevant token added to the context takes some weight from the "
         "relevant one: as irrelevant tokens are added, the weight on the relevant token and the answer's accuracy fall.")
PREDICTION = ("On the transformer trained for recall (claim 3's), from no irrelevant tokens to the most it was trained "
              "with, the weight its last layer's retrieving head puts on the asked value falls by >= 10% (relative) "
              "and the accuracy falls by >= 5 points.")
THRESHOLD = ("Supported if both falls exceed their margins (10% relative weight, 5 points accuracy) by more than the "
             "seed spread; not supported if either stays below its margin by more than the spread; inconclusive if "
             "the model did not learn the task (< 80% accuracy with no irrelevant tokens) or a fall is within the "
             "spread of its margin.")
CHANGES: list = []
EST_S = {"quick": 5, "full": 30}


def measure(scale: str, device: str) -> dict:
    setup = recall.SETUPS[scale]
    pairs = setup.test_pairs[len(setup.test_pairs) // 2]
    hi = setup.filler[1]
    fillers = sorted({0, hi // 4, hi // 2, 3 * hi // 4, hi})
    models = recall.trained("transformer", scale, device)["models"]
    probes = {f: [recall.probe(m, setup, pairs, 314, device, setup.test_n, filler=f, n_queries=4) for m in models]
              for f in fillers}
    return {"pairs": pairs, "fillers": fillers, "probes": probes, "recall_setup": recall.setup_dict(scale)}


def decide(m: dict) -> Decision:
    probes = recall.by_int(m["probes"])
    f0, f1 = min(probes), max(probes)
    first, last = probes[f0], probes[f1]
    weight_fall = [1 - b["weight"] / a["weight"] if a["weight"] > 0 else 0.0 for a, b in zip(first, last)]
    acc_fall = [a["acc"] - b["acc"] for a, b in zip(first, last)]
    base_acc = mean([a["acc"] for a in first])
    w, a = exceeds(weight_fall, 0.10), exceeds(acc_fall, 0.05)
    reasons = [f"accuracy with no irrelevant tokens: {base_acc:.0%} (>= 80% means the task was learned)",
               f"weight on the relevant value: {mean([p['weight'] for p in first]):.3f} -> "
               f"{mean([p['weight'] for p in last]):.3f}, a fall of {mean(weight_fall):.0%} (spread {spread(weight_fall):.0%};"
               f" >= 10%?)",
               f"accuracy: {base_acc:.0%} -> {mean([p['acc'] for p in last]):.0%}, a fall of {mean(acc_fall) * 100:.1f} "
               f"points (spread {spread(acc_fall) * 100:.1f}; >= 5?)"]
    if base_acc < 0.8:
        ok = None
        reasons.append("the model did not learn the task: inconclusive")
    elif w is False or a is False:
        ok = False
    elif w is None or a is None:
        ok = None
        reasons.append("a fall is within the seed spread of its margin: inconclusive")
    else:
        ok = True
    figure = (f"{f0} -> {f1} irrelevant tokens: weight on the relevant token {mean([p['weight'] for p in first]):.2f} -> "
              f"{mean([p['weight'] for p in last]):.2f}, accuracy {base_acc:.0%} -> {mean([p['acc'] for p in last]):.0%}")
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    fillers = m["fillers"]
    w = [mean([p["weight"] for p in m["probes"][f]]) for f in fillers]
    a = [mean([p["acc"] for p in m["probes"][f]]) for f in fillers]
    rows = [{"irrelevant_tokens": f, "prompt_tokens": m["probes"][f][0]["tokens"], "weight_on_relevant": w[i],
             "accuracy": a[i], "seeds": len(m["probes"][f])} for i, f in enumerate(fillers)]
    return Outcome.of(decide(m), m, [
        Plot("Attention weight on the relevant token", "irrelevant tokens in the context", "weight (best head, last layer)",
             [Series("weight", fillers, w)]),
        Plot("Recall accuracy", "irrelevant tokens in the context", "accuracy", [Series("accuracy", fillers, a)])], rows,
        [f"{m['pairs']} key-value pairs, 4 queries, irrelevant tokens drawn from a vocabulary of their own; only "
         "amounts the model saw in training, so a fall is dilution, not a length it never met."])

"""Claim 16: sending only the relevant context is cheaper, and costs no accuracy."""
import torch

from attnlab.data.synthetic import IGNORE, recall_batch
from attnlab.experiments import recall
from attnlab.experiments.base import Decision, Outcome, Plot, Series, compare, exceeds, mean, spread, timing, verdict

TITLE = "Send what is relevant, not everything"
CLAIM = ("A prompt with only the relevant context answers as well as one padded with everything that might be "
         "relevant, and its first token comes sooner: prompt processing grows with every token sent.")
PREDICTION = ("On the transformer trained for recall (claim 3's), the same question asked with only its key-value pair "
              "vs with every pair and the most irrelevant tokens it was trained with (N times the tokens): accuracy "
              "is no lower with the relevant pair alone, and the time to the first token of a batch of 32 such "
              "prompts is >= 2x higher for the long ones.")
THRESHOLD = ("Supported if the long prompts' accuracy is not above the short ones' by more than the seed spread, and "
             "their measured prefill time is >= 2x the short ones' (by more than the spread of the ratio over repeats). "
             "Not supported if the long prompts answer better beyond the spread or the time ratio is below 2x beyond "
             "its spread; inconclusive if the model did not learn the task (< 80% on the short prompts) or the ratio "
             "is within its spread of 2x.")
CHANGES: list = []
EST_S = {"quick": 8, "full": 40}
BATCH = 32


def _prompts(setup, pairs, filler, n, seed):
    x, y, info = recall_batch(n, setup.seq_len, setup.vocab, pairs, torch.Generator().manual_seed(seed), filler=filler,
                              n_queries=1)
    tokens = int(info["context_len"][0]) + 1
    return x[:, :tokens], y[:, :tokens]


def measure(scale: str, device: str) -> dict:
    setup = recall.SETUPS[scale]
    pairs = max(setup.train_pairs)
    kinds = {"relevant only": (1, 0), "everything": (pairs, setup.filler[1])}
    models = recall.trained("transformer", scale, device)["models"]
    out = {"pairs": pairs, "filler": setup.filler[1], "batch": BATCH, "kinds": {}, "recall_setup": recall.setup_dict(scale)}
    prompts = {k: _prompts(setup, p, f, setup.test_n, 1618) for k, (p, f) in kinds.items()}
    for k, (x, y) in prompts.items():
        accs = []
        for m in models:
            with torch.no_grad():
                pred = m(x.to(device))[0].argmax(-1).cpu()
            mask = y != IGNORE
            accs.append(float(((pred == y) & mask).sum()) / int(mask.sum()))
        out["kinds"][k] = {"tokens": x.shape[1], "acc": accs, "ttft_s": [], "ttft_1_s": []}
    # Time to first token: one prefill of BATCH prompts (and of one), the two kinds alternating, each warmed up.
    model = models[0]
    with torch.inference_mode():
        for r in range(5):
            for k in (list(prompts) if r % 2 == 0 else list(prompts)[::-1]):
                x = prompts[k][0].to(device)
                out["kinds"][k]["ttft_s"].append(timing(lambda: model(x[:BATCH], last_only=True), 3, 1, device=device)["median_s"])
                out["kinds"][k]["ttft_1_s"].append(timing(lambda: model(x[:1], last_only=True), 3, 1, device=device)["median_s"])
    return out


def decide(m: dict) -> Decision:
    short, long_ = m["kinds"]["relevant only"], m["kinds"]["everything"]
    ratio = [b / a for a, b in zip(short["ttft_s"], long_["ttft_s"])]
    better = compare(long_["acc"], short["acc"])  # True: the long prompts answer better beyond the spread
    r = exceeds(ratio, 2.0)
    reasons = [f"accuracy on the short prompts: {mean(short['acc']):.0%} (>= 80% means the task was learned)",
               f"accuracy: relevant only {mean(short['acc']):.1%} vs everything {mean(long_['acc']):.1%}; the long "
               f"prompts better beyond the seed spread: {'yes' if better else 'no'}",
               f"prefill time of {m['batch']} prompts: {short['tokens']} tokens {mean(short['ttft_s']) * 1e3:.2f} ms vs "
               f"{long_['tokens']} tokens {mean(long_['ttft_s']) * 1e3:.2f} ms, ratio {mean(ratio):.1f}x "
               f"(spread {spread(ratio):.1f}; >= 2x?)"]
    if mean(short["acc"]) < 0.8:
        ok = None
        reasons.append("the model did not learn the task: inconclusive")
    elif better or r is False:
        ok = False
    elif r is None:
        ok = None
        reasons.append("the time ratio is within its spread of 2x: inconclusive")
    else:
        ok = True
    figure = (f"{long_['tokens'] / short['tokens']:.0f}x the tokens: accuracy {mean(short['acc']):.0%} -> "
              f"{mean(long_['acc']):.0%}, prefill of {m['batch']} prompts {mean(ratio):.1f}x slower")
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    names = list(m["kinds"])
    k = m["kinds"]
    rows = [{"prompt": n, "tokens": k[n]["tokens"], "accuracy": mean(k[n]["acc"]), f"ttft_{m['batch']}_prompts_s":
             mean(k[n]["ttft_s"]), "ttft_1_prompt_s": mean(k[n]["ttft_1_s"])} for n in names]
    toks = [k[n]["tokens"] for n in names]
    return Outcome.of(decide(m), m, [
        Plot("Cost and accuracy vs prompt length", "prompt tokens", "value",
             [Series(f"prefill ms ({m['batch']} prompts)", toks, [mean(k[n]["ttft_s"]) * 1e3 for n in names]),
              Series("accuracy x 10", toks, [mean(k[n]["acc"]) * 10 for n in names])])], rows,
        ["A ~0.1M-parameter model: a single prompt's prefill is mostly fixed per-call overhead here (see the "
         "ttft_1_prompt_s column), which is why the time is measured on a batch of prompts, as a server runs them."])

"""Claim 13: speculative decoding speeds up decoding without changing greedy output."""
import copy

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tasks import make_task
from attnlab.engine import generate
from attnlab.engine.generate import sample_continuations
from attnlab.engine.quantize import set_precision
from attnlab.engine.speculative import speculative_generate
from attnlab.experiments.base import Decision, Outcome, Plot, Series, verdict
from attnlab.models import build_model
from attnlab.train import train_in_memory

TITLE = "Speculative decoding"
CLAIM = "A small draft proposing k tokens that the target verifies in one parallel pass speeds up decoding, with identical greedy output."
PREDICTION = ("Greedy output is identical at every k; acceptance falls as k grows; the speedup over plain decoding of "
              "the same target exceeds 1 at some k when the draft is much cheaper than the target and often agrees.")
THRESHOLD = "Supported if outputs are identical at every k and the best speedup is >= 1.2; not supported if outputs differ or no k reaches 1.0."
CHANGES = [
    {"date": "2026-11-30", "what": "method: an untimed warm-up of each k's speculative and plain paths before timing",
     "why": ("Each k lays the target's weights out anew for k+1 rows; the first call on that layout paid one-time "
             "costs inside the timed prompts. The threshold is unchanged; the reasons now show the per-prompt spread.")},
]
EST_S = {"quick": 85, "full": 420}  # seconds on a 2-core CPU: the report's progress estimate
GOOD, BREAK_EVEN = 1.2, 1.0  # the THRESHOLD above, as numbers


def _train(cfg, task, tc, device, teacher=None, batch=None):
    torch.manual_seed(0)
    batch = batch or task.batch
    return train_in_memory(build_model(cfg, device), lambda step: tuple(t.to(device) for t in batch(step)), tc,
                           teacher=teacher)


def measure(scale: str, device: str) -> dict:
    steps = 150 if scale == "quick" else 1500
    tc = TrainConfig(seq_len=96, batch_size=16, steps=steps, warmup_steps=steps // 10, corpus_max_bytes=3_000_000)
    task = make_task(tc)
    trained = _train(ModelConfig(dim=192, n_layers=6, n_heads=4), task, tc, device)
    target = set_precision(copy.deepcopy(trained), "fp32")
    new = 64 if scale == "quick" else 200
    prompt_len = 128
    # the target's own continuations of training-split prompts: the text the draft will be asked to predict
    # (distilling on it raised a draft's agreement from 60% to 77% in benchmarks/spec_models.py)
    samples = torch.tensor(sample_continuations(target, task.train_ids, 64 if scale == "quick" else 256,
                                                prompt_len, new, seed=1))

    def sample_batch(step):  # whole sample sequences, 16 at a time
        idx = torch.randint(0, len(samples), (16,), generator=torch.Generator().manual_seed(step))
        return samples[idx, :-1], samples[idx, 1:]

    draft = set_precision(_train(ModelConfig(dim=64, n_layers=1, n_heads=2, max_seq_len=prompt_len + new + 16), task,
                                 tc, device, teacher=trained, batch=sample_batch), "fp32")
    prompts = [task.val_ids[s:s + prompt_len].tolist() for s in (2000, 9000, 16000)]
    base = [generate(target, p, new).tokens for p in prompts]
    rows = []
    for k in (1, 2, 4, 6):
        # the verify pass has k+1 rows: the target's weights are laid out for that size (quantize.DenseLinear),
        # and plain decoding counts at the faster of the two layouts
        target_k = set_precision(copy.deepcopy(trained), "fp32", rows=k + 1)
        generate(target_k, prompts[0], 8)  # warm-up of the new layout and of the speculative path, untimed
        speculative_generate(target_k, prompts[0], 8, k=k, draft=draft)
        plain_s = [[0.0, 0.0] for _ in prompts]
        spec_s, accepted, proposed, identical = [], 0, 0, True
        for i, (p, expected) in enumerate(zip(prompts, base)):
            for j, m in enumerate((target, target_k)):
                plain_s[i][j] = generate(m, p, new).stats.total_s
            out = speculative_generate(target_k, p, new, k=k, draft=draft)
            spec_s.append(out.stats.total_s)
            accepted += round(out.stats.accepted * out.stats.proposed)
            proposed += out.stats.proposed
            identical &= out.tokens == expected
        plain = min(sum(s[j] for s in plain_s) for j in range(2))
        rows.append({"k": k, "speedup": plain / sum(spec_s), "acceptance": accepted / max(1, proposed),
                     "identical": identical, "speedup_by_prompt": [min(p) / s for p, s in zip(plain_s, spec_s)]})
    return {"rows": rows, "identical": all(r["identical"] for r in rows), "steps": steps, "samples": len(samples),
            "new_tokens": new}


def decide(measured: dict) -> Decision:
    rows = measured["rows"]
    same = all(r["identical"] for r in rows)
    best = max(rows, key=lambda r: r["speedup"])
    per = best.get("speedup_by_prompt") or [best["speedup"]]
    reasons = ["greedy output identical at every k: " + ("yes" if same else "no: at k = " + ", ".join(
        str(r["k"]) for r in rows if not r["identical"])),
        f"best speedup {best['speedup']:.2f}x at k={best['k']} (per prompt {min(per):.2f}-{max(per):.2f}x) >= {GOOD}: "
        f"{'yes' if best['speedup'] >= GOOD else 'no'}; >= {BREAK_EVEN}: {'yes' if best['speedup'] >= BREAK_EVEN else 'no'}"]
    ok = None if same and BREAK_EVEN <= best["speedup"] < GOOD else (same and best["speedup"] >= GOOD)
    figure = (f"best speedup {best['speedup']:.2f}x (k={best['k']}), acceptance {rows[0]['acceptance']:.0%} at "
              f"k={rows[0]['k']} -> {rows[-1]['acceptance']:.0%} at k={rows[-1]['k']}; greedy output identical: {same}")
    return Decision(verdict(ok), figure, reasons)


def run(scale: str, device: str) -> Outcome:
    m = measure(scale, device)
    rows = m["rows"]
    ks = [r["k"] for r in rows]
    return Outcome.of(decide(m), m, [
        Plot("Speedup vs k", "k (draft tokens per round)", "x plain decode", [Series("speedup", ks, [r["speedup"] for r in rows])]),
        Plot("Acceptance vs k", "k", "accepted / proposed", [Series("acceptance", ks, [r["acceptance"] for r in rows])])],
        rows,
        [f"Target ~2.7M parameters trained {m['steps']} steps on the embedded corpus; draft ~0.07M distilled from "
         f"it {m['steps']} steps on its greedy continuations of {m['samples']} training-split prompts; 3 held-out "
         "prompts. On a CPU the draft's per-token overhead is a large share of so small a target's cost.",
         "The best k is chosen on the same 3 prompts it is reported on, which flatters it a little."])

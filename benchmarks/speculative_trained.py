"""decode_vs_hf.py's trained section: quality of bf16 / int8 and speculative decoding on models trained on the
embedded corpus.

Trained section (models trained on the embedded corpus: benchmarks/cache/spec-target and spec-draft, built by
benchmarks/spec_models.py): bf16 / int8 held-out loss change, and speculative decoding with a draft model (k =
3..6) and with prompt lookup (n-gram sizes x k). Each setting is tried on TUNING prompts; the best (fp32: only
settings whose greedy output equals plain greedy decoding's) is then measured once, on HELD-OUT prompts disjoint
from the tuning ones, over --spec-rounds rounds. Speed-up = wall time of plain greedy decoding (the faster of its
two weight layouts) / wall time of speculative decoding, for the same prompts and number of tokens, on the clock of
decode_vs_hf.py (common.timed_call); every path (each layout, each setting, each dtype) warmed up first, the order
alternating per prompt. The JSON keeps the whole tuning table and the held-out figure.
"""
from __future__ import annotations

import copy
import statistics
from pathlib import Path

import torch

from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.engine.speculative import speculative_generate
from common import round_order, round_ratios, timed_call

DRAFT_KS = (3, 4, 5, 6)  # draft tokens per round tried with the draft model
LOOKUP = (((2, 4), 4), ((2, 4), 8), ((3, 8), 4), ((3, 8), 8))  # (n-gram min, max), k tried with prompt lookup


def trained_section(args) -> dict:
    """Quality of bf16/int8 and speculative decoding on models trained on the embedded corpus."""
    from attnlab.config import TrainConfig
    from attnlab.data.tasks import make_task
    from attnlab.resolve import load_model
    from attnlab.fit import evaluate

    target_dir, draft_dir = Path(args.target), Path(args.draft)
    if (target_dir / "manifest.json").exists() and (draft_dir / "manifest.json").exists():
        target, draft, origin = load_model(target_dir).model, load_model(draft_dir).model, f"{target_dir}, {draft_dir}"
    elif args.quick:
        target, draft, origin = _tiny_pair(), _tiny_pair(n_layers=1), "tiny untrained models (--quick smoke run)"
    else:
        return {"skipped": f"build {target_dir} and {draft_dir} first: python benchmarks/spec_models.py"}
    n_target = sum(p.numel() for p in target.parameters())  # before prepacking hides the matrices
    n_draft = sum(p.numel() for p in draft.parameters())
    task = make_task(TrainConfig(seq_len=256, batch_size=8, eval_batches=1 if args.quick else 8))
    batches = task.eval_batches()
    quality = {}
    low = [dt for dt in ("bf16", "int8") if dt in args.dtypes]
    for dt in ("fp32", *low):
        quality[dt] = evaluate(set_precision(copy.deepcopy(target), dt), batches, "cpu")["val_loss"]
    for dt in low:
        quality[f"{dt}_relative_change"] = quality[dt] / quality["fp32"] - 1
    spec = speculative_section(target, draft, task.val_ids.tolist(), [d for d in ("fp32", "bf16") if d in args.dtypes],
                               args.spec_tokens, 1 if args.quick else 4, args.spec_rounds)
    fp32 = spec["fp32"]
    return {"models": origin, "target_params": n_target, "draft_params": n_draft, "held_out_loss": quality, **spec,
            "targets": {**{f"{dt}_loss_change_le_1pct": abs(quality[f"{dt}_relative_change"]) <= 0.01 for dt in low},
                        "speculative_draft_ge_1.5x_held_out": fp32["draft"]["held_out"]["speedup"] >= 1.5,
                        "prompt_lookup_ge_1.5x_held_out": fp32["lookup"]["held_out"]["speedup"] >= 1.5,
                        "fp32_greedy_output_identical": spec["fp32_greedy_output_identical"]}}


def _tiny_pair(**kw):
    from attnlab.config import ModelConfig
    from attnlab.models import build_model

    torch.manual_seed(len(kw))
    return build_model(ModelConfig(**{**dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, max_seq_len=1024), **kw}))


def speculative_section(target, draft, val: list[int], dtypes: list[str], n: int, n_prompts: int, rounds: int) -> dict:
    """Tune each method's setting on tuning prompts, then measure the chosen one on held-out prompts.

    Draft model: 200-token windows of the held-out split, alternately tuning and held-out. Prompt lookup:
    the 2 * n_prompts most repetitive 300-token windows (chosen from the text alone), alternately tuning and
    held-out; plus, with the chosen setting only, the same code twice (pays only if the target copies it)."""
    starts = list(range(1000, 1000 + 2 * n_prompts * 4500, 4500))
    if starts[-1] + 200 > len(val):
        raise ValueError(f"the held-out split has {len(val)} tokens; {2 * n_prompts} prompts need {starts[-1] + 200}")
    windows = most_repetitive_windows(val, 300, 2 * n_prompts)
    sets = {"draft": {"tuning": [val[s:s + 200] for s in starts[0::2]],
                      "held_out": [val[s:s + 200] for s in starts[1::2]]},
            "lookup": {"tuning": [val[s:s + 300] for s in windows[0::2]],
                       "held_out": [val[s:s + 300] for s in windows[1::2]]}}
    code_twice = val[5000:5150] * 2
    out: dict = {"prompts": {"draft": {"tokens": 200, "tuning_starts": starts[0::2], "held_out_starts": starts[1::2]},
                             "lookup": {"tokens": 300, "tuning_starts": windows[0::2],
                                        "held_out_starts": windows[1::2],
                                        "share_of_8grams_seen_before": [repeat_share(val[s:s + 300]) for s in windows]},
                             "code_twice": "held-out split [5000:5150] twice"},
                 "speculative_tokens": n, "held_out_rounds": rounds}
    for dt in dtypes:  # the same precision for plain and speculative decoding
        plain1 = set_precision(copy.deepcopy(target), dt)  # weights laid out for 1 row: plain decoding
        layouts: dict[int, torch.nn.Module] = {}  # and for a verify pass's k+1 rows; the faster plain counts

        def verify(k: int, dt=dt, layouts=layouts):
            if k + 1 not in layouts:
                layouts[k + 1] = set_precision(copy.deepcopy(target), dt, rows=k + 1)
            return layouts[k + 1]
        dm = set_precision(copy.deepcopy(draft), "fp32")  # small matrices: fp32 is the faster path
        settings = {"draft": {f"k{k}": dict(k=k, draft=dm) for k in DRAFT_KS},
                    "lookup": {f"ngram{lo}-{hi}_k{k}": dict(k=k, prompt_lookup=True, lookup_ngram=(lo, hi))
                               for (lo, hi), k in LOOKUP}}
        out[dt] = {}
        for method, options in settings.items():
            run = lambda how, prompts, r=1: _measure([plain1, verify(how["k"])], verify(how["k"]), prompts, n, how, r)
            tuning = {}
            for name, how in options.items():
                tuning[name] = run(how, sets[method]["tuning"])
                print(f"tuning {dt} {method} {name}: {tuning[name]['speedup']:.2f}x", flush=True)
            # In fp32 greedy output must equal plain greedy decoding's; in bf16 a near-tie can flip (reported).
            eligible = [name for name, v in tuning.items() if dt != "fp32" or v["identical_greedy_output"]]
            chosen = max(eligible or tuning, key=lambda name: tuning[name]["speedup"])
            entry = out[dt][method] = {"tuning": tuning, "chosen": chosen,
                                       "held_out": run(options[chosen], sets[method]["held_out"], rounds)}
            if method == "lookup":
                entry["held_out_code_twice"] = run(options[chosen], [code_twice], rounds)
            print(f"held-out {dt} {method} {chosen}: {entry['held_out']['speedup']:.2f}x", flush=True)
    plain_out = generate(set_precision(copy.deepcopy(target), "fp32"), code_twice, n).tokens
    out["code_twice_output_copies_the_code"] = sum(a == b for a, b in zip(plain_out, val[5000:5150] * 2)) / len(plain_out)
    fp32_runs = [v for m in out["fp32"].values()
                 for v in (*m["tuning"].values(), m["held_out"], m.get("held_out_code_twice")) if v]
    out["fp32_greedy_output_identical"] = all(v["identical_greedy_output"] for v in fp32_runs)
    out["summary"] = {dt: {m: {"chosen": e["chosen"], "tuning_speedup": e["tuning"][e["chosen"]]["speedup"],
                               "held_out_speedup": e["held_out"]["speedup_rounds"],
                               "held_out_acceptance": e["held_out"]["acceptance"]}
                           for m, e in out[dt].items()} for dt in dtypes}
    return out


def _measure(plain_models, target, prompts, n: int, how: dict, rounds: int = 1) -> dict:
    """Plain greedy decoding (each of plain_models: the same weights in different layouts) and speculative
    decoding of `target`, every call timed by the benchmark's wall clock; each path warmed up on the first
    prompt first; the order reversed on every other prompt. Per round, speedup = the faster layout's plain
    total / the speculative total; acceptance = accepted / proposed drafts."""
    paths = [lambda p, m=m: generate(m, p, n) for m in plain_models]
    paths.append(lambda p: speculative_generate(target, p, n, **how))
    for f in paths:  # warm-up, untimed
        f(prompts[0])
    spent = [[0.0] * rounds for _ in paths]  # seconds, per path and round
    accepted = proposed = 0
    same = True
    for r in range(rounds):
        for i, p in enumerate(prompts):
            outs = {}
            for j in round_order(range(len(paths)), r + i):
                dt, outs[j] = timed_call(lambda: paths[j](p))
                spent[j][r] += dt
            b = outs[len(paths) - 1]
            accepted += round(b.stats.accepted * b.stats.proposed)
            proposed += b.stats.proposed
            same &= all(outs[j].tokens == b.tokens for j in range(len(paths) - 1))
    best = min(range(len(plain_models)), key=lambda j: sum(spent[j]))
    tokens = n * len(prompts)
    speedups = round_ratios(spent[best], spent[-1])
    return {"speedup": speedups["median"], "speedup_rounds": speedups, "acceptance": accepted / max(1, proposed),
            "plain_ms_per_token": 1e3 * statistics.median(spent[best]) / tokens,
            "plain_ms_per_token_by_layout": {f"rows{getattr(m, 'rows', 1)}": 1e3 * statistics.median(s) / tokens
                                             for m, s in zip(plain_models, spent)},
            "speculative_ms_per_token": 1e3 * statistics.median(spent[-1]) / tokens,
            "identical_greedy_output": same, "prompts": len(prompts), "rounds": rounds}


def repeat_share(tokens: list[int], n: int = 8) -> float:
    """Share of the n-grams of `tokens` that already occurred earlier in it: how repetitive a text is."""
    seen, hits = set(), 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        hits += gram in seen
        seen.add(gram)
    return hits / max(1, len(tokens) - n + 1)


def most_repetitive_windows(ids: list[int], length: int, count: int, stride: int = 50) -> list[int]:
    """Starts of the `count` non-overlapping windows with the highest repeat_share, in that order (chosen from
    the text alone, before any model sees it)."""
    ranked = sorted(range(0, len(ids) - length, stride), key=lambda s: -repeat_share(ids[s:s + length]))
    picked: list[int] = []
    for s in ranked:
        if all(abs(s - p) >= length for p in picked):
            picked.append(s)
            if len(picked) == count:
                break
    return picked

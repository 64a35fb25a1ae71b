"""attnlab's engine vs Hugging Face transformers on GPT-2 small's shape, and speculative decoding, in one run.

    python benchmarks/decode_vs_hf.py [--rounds 6] [--new-tokens 32] [--quick] [--as-avx2]

GPT-2 section. Same random weights on both sides (HF builds GPT-2 small and saves safetensors; attnlab loads
the folder), batch 1, greedy, the same dtype on both sides where HF has it (fp32, bf16; attnlab's int8 is
compared with HF fp32 and bf16), the machine's matmul peak and bandwidth calibrated in the same process just
before and after.

The clock, one for every side: this script reads time.perf_counter() just before the call and just after it
returns (common.timed_call), around HF's `model.generate(...)` and attnlab's `generate(...)` alike, request
checks and set-up included; neither library's own timestamps are used.
- TTFT = the wall time of a call that asks for one new token: from the call until the first token is returned.
- TPOT is timed twice: after the 512-token prompt, and after a prompt that fills the context (1,024 - n tokens),
  where each step reads about twice the KV cache (~35 MB more per step in fp32 for GPT-2 small).
- time per output token (TPOT) = (wall time of a call for n tokens - that of the 1-token call of the same round,
  same prompt) / (n - 1): both calls pay the same prefill, so the difference is the n - 1 decode steps.
  (`min_new_tokens` holds HF to exactly n; attnlab has no stop token here.) Chosen over streamer callbacks
  because it needs no hook inside either library: the same two clock reads around an ordinary call.
Order: the sides run forward in even rounds and reversed in odd ones (A B C, C B A, ...: ABBA for two sides);
--rounds is rounded up to even. Before any timing, every side (each library, each dtype) runs every timed call
shape once, untimed. Reported: each side's median, min and max over rounds, and each ratio as the median (and
min, max) of per-round ratios, the two sides of a ratio having been timed in the same round.

Trained section (models trained on the embedded corpus: benchmarks/cache/spec-target and spec-draft, built by
benchmarks/spec_models.py): bf16 / int8 held-out loss change, and speculative decoding with a draft model
(k = 3..6) and with prompt lookup (n-gram sizes x k). Each setting is tried on TUNING prompts; the best
(fp32: only settings whose greedy output equals plain greedy decoding's) is then measured once, on HELD-OUT
prompts disjoint from the tuning ones, over --spec-rounds rounds. Speed-up = wall time of plain greedy decoding
(the faster of its two weight layouts) / wall time of speculative decoding, for the same prompts and number of
tokens, on the same clock as above; every path (each layout, each setting, each dtype) warmed up first, the
order alternating per prompt. The JSON keeps the whole tuning table and the held-out figure.
bf16 and int8 (whose activations are bf16) run only where attnlab.runtime finds bf16 native: on a CPU that
emulates it they are ~100x slower than fp32 and are skipped, and the JSON says so (--dtypes forces them).
--quick: a 2-layer GPT-2 and, without the cached models, tiny untrained ones: a smoke run, not a measurement.
--as-avx2: the whole run, both libraries, in a process held to AVX2 (attnlab.runtime.AVX2_ONLY_ENV), the decode
targets' other machine class; it tests the code paths such a CPU takes, on this machine's cores and memory.
Writes benchmarks/results/decode_vs_hf.json (decode_vs_hf_avx2.json with --as-avx2).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
from pathlib import Path

import torch

from attnlab.cli_measure import warn_if_emulated
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision, weight_bytes
from attnlab.engine.speculative import speculative_generate
from attnlab.models.hf import load_hf
from attnlab.runtime import fast_dtypes
from common import (context, matmul_peak_flops, memory_bandwidth, rerun_limited_to_avx2, round_order, set_threads,
                    summarize, timed_call, write_json)

DRAFT_KS = (3, 4, 5, 6)  # draft tokens per round tried with the draft model
LOOKUP = (((2, 4), 4), ((2, 4), 8), ((3, 8), 4), ((3, 8), 8))  # (n-gram min, max), k tried with prompt lookup


def prefill_flops(n_params_nonembed: int, n_layers: int, dim: int, vocab: int, T: int) -> float:
    """2 * N * T (every weight once per token) + 2 * L * T^2 * dim (causal QK^T and AV) + the last LM head row."""
    return 2 * n_params_nonembed * T + 2 * n_layers * T * T * dim + 2 * dim * vocab


def decode_bytes_per_token(model) -> int:
    """Weight bytes one decode step reads: all of them, less the embedding table (one row per token), unless the
    table is also the LM head (tied), which is read whole every token."""
    table = model.tok_emb.weight
    head = {t.data_ptr() for t in [*model.head.parameters(), *model.head.buffers()]}
    return weight_bytes(model) - (0 if table.data_ptr() in head else table.numel() * table.element_size())


def _ratios(a: list[float], b: list[float]) -> dict:
    """Per-round a/b (both timed in the same round): median, min, max."""
    return summarize([x / y for x, y in zip(a, b)])


def gpt2_section(args, peak: float, bandwidth: float) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    quick_cfg = dict(vocab_size=1024, n_layer=2, n_embd=64, n_head=4, n_positions=256, bos_token_id=1023,
                     eos_token_id=1023)
    hf_cfg = GPT2Config(**quick_cfg) if args.quick else GPT2Config()
    hf = GPT2LMHeadModel(hf_cfg).eval()
    folder = tempfile.mkdtemp()
    hf.save_pretrained(folder)
    base, cfg, _, _ = load_hf(folder)
    low = [dt for dt in ("bf16", "int8") if dt in args.dtypes]  # reduced precisions this run measures
    models = {dt: set_precision(copy.deepcopy(base), dt) for dt in ("fp32", *low)}
    hf_models = {"fp32": hf, **({"bf16": copy.deepcopy(hf).to(torch.bfloat16)} if "bf16" in low else {})}
    short, long_ = (128, 254) if args.quick else (512, 1022)  # long: the context less room for the new tokens
    ctx = torch.randint(0, cfg.vocab_size, (1, long_ + 2), generator=torch.Generator().manual_seed(1))
    n = args.new_tokens
    # decode is also timed where the context ends full (prompt + n = the model's context, the most generate
    # accepts), so the n - 1 timed steps attend over 1,024 - n .. 1,022 cached positions
    deep = cfg.max_seq_len - n

    def hf_call(m, ids, k):
        with torch.inference_mode():
            out = m.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0)
        return out[0, ids.shape[1]:].tolist()

    sides = {}  # interleaved so that the sides of each ratio run next to each other
    for dt in ("fp32", *low):
        if dt in hf_models:
            sides[f"hf_{dt}"] = lambda ids, k, m=hf_models[dt]: hf_call(m, ids, k)
        sides[f"attnlab_{dt}"] = lambda ids, k, m=models[dt]: generate(m, ids[0].tolist(), k).tokens
    calls = {"ttft_short": (ctx[:, :short], 1), "n_short": (ctx[:, :short], n), "ttft_long": (ctx[:, :long_], 1),
             "one_deep": (ctx[:, :deep], 1), "n_deep": (ctx[:, :deep], n)}
    for side in sides:  # warm-up: every side, every timed call shape, untimed
        for ids, k in calls.values():
            sides[side](ids, k)
    t = {f"{side}_{what}": [] for side in sides for what in ("ttft_short", "ttft_long", "tpot", "tpot_deep")}
    tokens = {}
    rounds = args.rounds + args.rounds % 2
    for r in range(rounds):
        for side in round_order(list(sides), r):
            t1, _ = timed_call(lambda: sides[side](*calls["ttft_short"]))
            tn, tokens[side] = timed_call(lambda: sides[side](*calls["n_short"]))
            tl, _ = timed_call(lambda: sides[side](*calls["ttft_long"]))
            d1, _ = timed_call(lambda: sides[side](*calls["one_deep"]))
            dn, _ = timed_call(lambda: sides[side](*calls["n_deep"]))
            t[f"{side}_ttft_short"].append(t1)
            t[f"{side}_tpot"].append((tn - t1) / (n - 1))
            t[f"{side}_ttft_long"].append(tl)
            t[f"{side}_tpot_deep"].append((dn - d1) / (n - 1))
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{s} {1e3 * t[f'{s}_tpot'][-1]:.0f} ms/token" for s in sides),
              flush=True)
    med = {k: statistics.median(v) for k, v in t.items()}
    nonembed = sum(p.numel() for name, p in base.named_parameters() if "tok_emb" not in name and "pos_enc" not in name)
    res = {"rounds": rounds, "order": "forward in even rounds, reversed in odd", "sides": list(sides),
           "raw_s": {k: summarize(v) for k, v in t.items()},
           "greedy_tokens_identical_to_hf": {dt: tokens[f"attnlab_{dt}"] == tokens[f"hf_{dt}"] for dt in hf_models}}
    hf_tpot = t["hf_fp32_tpot"]
    for dt in ("fp32", *low):
        ours = t[f"attnlab_{dt}_tpot"]
        per_token_bytes = decode_bytes_per_token(models[dt])
        bound = per_token_bytes / bandwidth
        d = res[f"decode_{dt}"] = {
            "tpot_ms": med[f"attnlab_{dt}_tpot"] * 1e3, "tpot_ms_min": 1e3 * min(ours), "tpot_ms_max": 1e3 * max(ours),
            "tok_per_s": 1 / med[f"attnlab_{dt}_tpot"],
            "speedup_vs_hf_fp32": _ratios(hf_tpot, ours)["median"], "speedup_vs_hf_fp32_rounds": _ratios(hf_tpot, ours),
            "bandwidth_bound_ms": bound * 1e3, "pct_of_bandwidth_bound": 100 * bound / med[f"attnlab_{dt}_tpot"],
            "weight_bytes_read_per_token": per_token_bytes}
        same = "bf16" if dt != "fp32" and "bf16" in hf_models else "fp32"  # int8 runs bf16 activations
        if same != "fp32":
            d[f"speedup_vs_hf_{same}"] = _ratios(t[f"hf_{same}_tpot"], ours)["median"]
            d[f"speedup_vs_hf_{same}_rounds"] = _ratios(t[f"hf_{same}_tpot"], ours)
        deep_ours = t[f"attnlab_{dt}_tpot_deep"]
        d["at_full_context"] = {
            "prompt_tokens": deep, "cached_positions": [deep, deep + n - 2],
            "tpot_ms": 1e3 * statistics.median(deep_ours), "tpot_ms_min": 1e3 * min(deep_ours),
            "tpot_ms_max": 1e3 * max(deep_ours),
            "hf_fp32_tpot_ms": 1e3 * med["hf_fp32_tpot_deep"],
            "speedup_vs_hf_fp32": _ratios(t["hf_fp32_tpot_deep"], deep_ours)["median"],
            "speedup_vs_hf_fp32_rounds": _ratios(t["hf_fp32_tpot_deep"], deep_ours)}
    for dt in hf_models:
        v = t[f"hf_{dt}_tpot"]
        res[f"decode_hf_{dt}"] = {"tpot_ms": 1e3 * med[f"hf_{dt}_tpot"], "tpot_ms_min": 1e3 * min(v),
                                  "tpot_ms_max": 1e3 * max(v), "tok_per_s": 1 / med[f"hf_{dt}_tpot"],
                                  "at_full_context_tpot_ms": 1e3 * med[f"hf_{dt}_tpot_deep"]}
    for label, what, T in (("ttft_512", "ttft_short", short), ("ttft_1024", "ttft_long", long_)):
        fl = prefill_flops(nonembed, cfg.n_layers, cfg.dim, cfg.vocab_size, T)
        ours, theirs = t[f"attnlab_fp32_{what}"], t[f"hf_fp32_{what}"]
        entry = res[label] = {"prompt_tokens": T, "attnlab_s": statistics.median(ours), "hf_s": statistics.median(theirs),
                              "attnlab_s_range": [min(ours), max(ours)], "hf_s_range": [min(theirs), max(theirs)],
                              "ratio_attnlab_over_hf": _ratios(ours, theirs)["median"],
                              "ratio_rounds": _ratios(ours, theirs),
                              "attnlab_pct_of_matmul_peak": 100 * fl / statistics.median(ours) / peak,
                              "hf_pct_of_matmul_peak": 100 * fl / statistics.median(theirs) / peak, "by_dtype": {}}
        for dt in low:  # attnlab's reduced precisions against HF in the same dtype where it has one, else fp32
            ref = f"hf_{dt}" if dt in hf_models else "hf_bf16" if "bf16" in hf_models else "hf_fp32"
            mine = t[f"attnlab_{dt}_{what}"]
            entry["by_dtype"][dt] = {"attnlab_s": statistics.median(mine), "attnlab_s_range": [min(mine), max(mine)],
                                     "against": ref, "against_s": statistics.median(t[f"{ref}_{what}"]),
                                     "ratio": _ratios(mine, t[f"{ref}_{what}"])}
    res["targets"] = {
        "decode_fp32_ge_1.5x_hf": res["decode_fp32"]["speedup_vs_hf_fp32"] >= 1.5,
        "decode_fp32_ge_1.5x_hf_at_full_context": res["decode_fp32"]["at_full_context"]["speedup_vs_hf_fp32"] >= 1.5,
        **{f"decode_{dt}_ge_2.5x_hf_fp32": res[f"decode_{dt}"]["speedup_vs_hf_fp32"] >= 2.5 for dt in low},
        **{f"decode_{dt}_ge_2.5x_hf_fp32_at_full_context":
           res[f"decode_{dt}"]["at_full_context"]["speedup_vs_hf_fp32"] >= 2.5 for dt in low},
        "ttft_512_le_0.9x_hf": res["ttft_512"]["ratio_attnlab_over_hf"] <= 0.9,
        "ttft_1024_le_0.9x_hf": res["ttft_1024"]["ratio_attnlab_over_hf"] <= 0.9,
    }
    res["cache_vs_no_cache"] = cache_section(models["fp32"], ctx, (32, long_ - 8) if args.quick else (128, 1016),
                                             max(2, rounds // 2))
    return res


def cache_section(model, ctx: torch.Tensor, lengths, rounds: int) -> dict:
    """fp32 decode with vs without the KV cache. Both sides are attnlab's generate, so its own TPOT (the same
    clock on both sides) is used; each path warmed up, the order alternating per round."""
    cache = {}
    for T in lengths:
        prompt = ctx[0, :T].tolist()
        paths = {"cached": lambda: generate(model, prompt, 5), "uncached": lambda: generate(model, prompt, 5, use_cache=False)}
        for f in paths.values():
            f()
        tpot = {name: [] for name in paths}
        for r in range(rounds):
            for name in round_order(list(paths), r):
                tpot[name].append(paths[name]().stats.tpot_s)
        cache[str(T)] = {"cached_tpot_ms": 1e3 * statistics.median(tpot["cached"]),
                         "uncached_tpot_ms": 1e3 * statistics.median(tpot["uncached"]),
                         "speedup": _ratios(tpot["uncached"], tpot["cached"])["median"],
                         "speedup_rounds": _ratios(tpot["uncached"], tpot["cached"])}
    return cache


def trained_section(args) -> dict:
    """Quality of bf16/int8 and speculative decoding on models trained on the embedded corpus."""
    from attnlab.config import TrainConfig
    from attnlab.data.tasks import make_task
    from attnlab.loading import load_any
    from attnlab.train import evaluate

    target_dir, draft_dir = Path(args.target), Path(args.draft)
    if (target_dir / "manifest.json").exists() and (draft_dir / "manifest.json").exists():
        target, draft, origin = load_any(target_dir).model, load_any(draft_dir).model, f"{target_dir}, {draft_dir}"
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
    speedups = _ratios(spent[best], spent[-1])
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="GPT-2 rounds (rounded up to even)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--spec-tokens", type=int, default=96)
    ap.add_argument("--spec-rounds", type=int, default=3, help="rounds of the held-out speculative measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="benchmarks/cache/spec-target")
    ap.add_argument("--draft", default="benchmarks/cache/spec-draft")
    ap.add_argument("--skip-trained", action="store_true")
    ap.add_argument("--skip-gpt2", action="store_true", help="only the trained-model section (quality, speculative)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny models, 2 rounds, few tokens")
    ap.add_argument("--dtypes", help="comma-separated, from fp32,bf16,int8 (default: those native here, "
                                     "attnlab.runtime.fast_dtypes)")
    ap.add_argument("--as-avx2", action="store_true",
                    help="hold torch, oneDNN, MKL and attnlab's kernels to AVX2 (an AVX2-only machine emulated on this "
                         "CPU; writes decode_vs_hf_avx2.json unless --out is given)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.as_avx2:
        rerun_limited_to_avx2()
    args.out = args.out or f"benchmarks/results/decode_vs_hf{'_avx2' if args.as_avx2 else ''}.json"
    if args.quick:
        args.rounds, args.new_tokens, args.spec_tokens, args.spec_rounds = 2, 4, 16, 2
    set_threads(args.threads)
    if args.dtypes:
        args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        for dt in args.dtypes:
            warn_if_emulated("decode_vs_hf", dt)
    else:
        args.dtypes = list(fast_dtypes("cpu"))
    args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]  # fp32 is every comparison's reference
    out = {"benchmark": "decode_vs_hf", "context": context(), "quick": args.quick, "batch": 1,
           "new_tokens": args.new_tokens, "dtypes": args.dtypes,
           "clock": "time.perf_counter() read by the benchmark around each whole call, on every side"}
    skipped = [dt for dt in ("bf16", "int8") if dt not in args.dtypes]
    if skipped:
        out["skipped_dtypes"] = {dt: "bf16 is emulated on this CPU (no avx512_bf16 or AMX), ~100x slower than fp32"
                                 + ("; int8 weight-only runs bf16 activations" if dt == "int8" else "")
                                 for dt in skipped}
    if not args.skip_gpt2:
        peak0, bw0 = matmul_peak_flops(), memory_bandwidth()
        g = out["gpt2_small"] = gpt2_section(args, peak0, bw0)
        peak1, bw1 = matmul_peak_flops(), memory_bandwidth()
        out["calibration"] = {"matmul_peak_flops": [peak0, peak1], "bandwidth_bytes_per_s": [bw0, bw1]}
        for dt in args.dtypes:
            d, t5 = g[f"decode_{dt}"], g["ttft_512"]
            ttft = t5["ratio_attnlab_over_hf"] if dt == "fp32" else t5["by_dtype"][dt]["ratio"]["median"]
            print(f"attnlab {dt}: {d['tpot_ms']:.1f} ms/token, {d['speedup_vs_hf_fp32']:.2f}x HF fp32 "
                  + "".join(f"({d[k]:.2f}x HF bf16) " for k in ["speedup_vs_hf_bf16"] if k in d)
                  + f"| at full context {d['at_full_context']['tpot_ms']:.1f} ms/token, "
                  + f"{d['at_full_context']['speedup_vs_hf_fp32']:.2f}x HF fp32 | TTFT 512 {ttft:.2f}x HF")
        print("targets:", g["targets"])
    if not args.skip_trained:
        t = out["trained"] = trained_section(args)
        print(json.dumps(t.get("summary", t), indent=1))
        print("targets:", t.get("targets"))
    _keep_skipped_sections(args.out, out)
    write_json(args.out, out)


def _keep_skipped_sections(path: str, out: dict) -> None:
    """A run that skips a section keeps that section from the file's previous run, marked with its date."""
    old_path = Path(path)
    if not old_path.exists():
        return
    try:
        old = json.loads(old_path.read_text())
    except json.JSONDecodeError:
        return
    for key in ("gpt2_small", "calibration", "trained"):
        if key not in out and key in old:
            out[key] = old[key]
            out.setdefault("sections_from_earlier_run", {})[key] = old.get("context", {}).get("date", "unknown")


if __name__ == "__main__":
    main()

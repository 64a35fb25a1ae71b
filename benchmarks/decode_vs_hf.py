"""attnlab's engine vs Hugging Face transformers on GPT-2 small's shape, side by side in one run.

    python benchmarks/decode_vs_hf.py [--pairs 5] [--new-tokens 32]

Same random weights in both (HF builds GPT-2 small, saves safetensors, attnlab loads the folder),
batch 1, greedy, the machine's calibrated matmul peak and bandwidth measured in the same process. One
clock for both sides: the wall time of a whole call (TTFT = a call returning one token; time per token =
(wall time for n tokens - for 1) / (n - 1)), every path warmed up, each round in another order.
Also: decode with vs without the KV cache; bf16 / int8 held-out loss change and speculative decoding on
models trained on the embedded corpus (benchmarks/cache/spec-target and spec-draft, see --help).
bf16 and int8 (whose activations are bf16) run only where attnlab.runtime finds bf16 native: on a CPU that
emulates it they are ~100x slower than fp32 and are skipped, and the JSON says so (--dtypes forces them).
Writes benchmarks/results/decode_vs_hf.json.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch

from attnlab.cli_measure import warn_if_emulated
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision, weight_bytes
from attnlab.models.hf import load_hf
from attnlab.runtime import fast_dtypes
from common import context, matmul_peak_flops, memory_bandwidth, set_threads, summarize, write_json


def hf_generate_s(hf, ids: torch.Tensor, n: int) -> tuple[float, list[int]]:
    with torch.inference_mode():
        t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t, out[0, ids.shape[1]:].tolist()


def prefill_flops(n_params_nonembed: int, n_layers: int, dim: int, vocab: int, T: int) -> float:
    """2 * N * T (every weight once per token) + 2 * L * T^2 * dim (causal QK^T and AV) + the last LM head row."""
    return 2 * n_params_nonembed * T + 2 * n_layers * T * T * dim + 2 * dim * vocab


def gpt2_section(args, peak: float, bandwidth: float) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()
    folder = tempfile.mkdtemp()
    hf.save_pretrained(folder)
    base, cfg, _, _ = load_hf(folder)
    low = [dt for dt in ("bf16", "int8") if dt in args.dtypes]  # reduced precisions this run measures
    models = {dt: set_precision(copy.deepcopy(base), dt) for dt in ("fp32", *low)}
    ctx = torch.randint(0, cfg.vocab_size, (1, 1024), generator=torch.Generator().manual_seed(1))
    p512, p1024 = ctx[:, :512], ctx
    n = args.new_tokens
    sides = {"hf": lambda ids, k: hf_generate_s(hf, ids, k)[1]}
    for dt in ("fp32", *low):
        sides[dt] = lambda ids, k, m=models[dt]: generate(m, ids[0].tolist(), k).tokens
    rows = {f"{side}_{what}": [] for side in sides for what in ("ttft512", "ttft1024", "tpot")}
    tokens = {}

    def wall_s(side, ids, k):
        """The one clock for every side: wall time of the whole call, from the call until its tokens exist."""
        t = time.perf_counter()
        out = sides[side](ids, k)
        return time.perf_counter() - t, out

    for side in sides:  # warm up every path that is timed
        for ids, k in ((p512, 1), (p512, n), (p1024[:, :1024 - 2], 1)):
            wall_s(side, ids, k)
    names = list(sides)
    for r in range(args.pairs):  # each round in another order: HF first, then second, ...
        for side in names[r % len(names):] + names[:r % len(names)]:
            t1, _ = wall_s(side, p512, 1)  # TTFT = a call that returns one new token
            tn, toks = wall_s(side, p512, n)  # per token = (wall time for n tokens - for 1) / (n - 1)
            rows[f"{side}_ttft512"].append(t1)
            rows[f"{side}_tpot"].append((tn - t1) / (n - 1))
            rows[f"{side}_ttft1024"].append(wall_s(side, p1024[:, :1024 - 2], 1)[0])
            tokens[side] = toks
    same_tokens = tokens["fp32"] == tokens["hf"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    nonembed = sum(p.numel() for name, p in base.named_parameters() if "tok_emb" not in name and "pos_enc" not in name)
    res = {"raw": {k: summarize(v) for k, v in rows.items()}, "greedy_tokens_identical_to_hf": same_tokens}
    for dt in ("fp32", *low):
        per_token_bytes = weight_bytes(models[dt]) - cfg.vocab_size * cfg.dim * (4 if dt == "fp32" else 2)  # the
        # embedding table is read one row per token, not whole
        bound = per_token_bytes / bandwidth
        res[f"decode_{dt}"] = {"tpot_ms": med[f"{dt}_tpot"] * 1e3, "tok_per_s": 1 / med[f"{dt}_tpot"],
                               "speedup_vs_hf_fp32": med["hf_tpot"] / med[f"{dt}_tpot"],
                               "bandwidth_bound_ms": bound * 1e3, "pct_of_bandwidth_bound": 100 * bound / med[f"{dt}_tpot"],
                               "weight_bytes_read_per_token": per_token_bytes}
    res["decode_hf_fp32"] = {"tpot_ms": med["hf_tpot"] * 1e3, "tok_per_s": 1 / med["hf_tpot"]}
    for T in (512, 1024):
        fl = prefill_flops(nonembed, cfg.n_layers, cfg.dim, cfg.vocab_size, T)
        ours, theirs = med[f"fp32_ttft{T}"], med[f"hf_ttft{T}"]
        res[f"ttft_{T}"] = {"attnlab_s": ours, "hf_s": theirs, "ratio_attnlab_over_hf": ours / theirs,
                            "attnlab_pct_of_matmul_peak": 100 * fl / ours / peak,
                            "hf_pct_of_matmul_peak": 100 * fl / theirs / peak}
    res["targets"] = {
        "decode_fp32_ge_1.5x_hf": res["decode_fp32"]["speedup_vs_hf_fp32"] >= 1.5,
        **{f"decode_{dt}_ge_2.5x_hf_fp32": res[f"decode_{dt}"]["speedup_vs_hf_fp32"] >= 2.5 for dt in low},
        "ttft_512_le_0.9x_hf": res["ttft_512"]["ratio_attnlab_over_hf"] <= 0.9,
        "ttft_1024_le_0.9x_hf": res["ttft_1024"]["ratio_attnlab_over_hf"] <= 0.9,
    }
    # with vs without the cache, fp32, at two context lengths
    cache = {}
    for T in (128, 1024 - 8):
        prompt = ctx[0, :T].tolist()
        with_c, without = [], []
        for _ in range(max(2, args.pairs // 2)):
            with_c.append(generate(models["fp32"], prompt, 5).stats.tpot_s)
            without.append(generate(models["fp32"], prompt, 5, use_cache=False).stats.tpot_s)
        cache[str(T)] = {"cached_tpot_ms": 1e3 * statistics.median(with_c),
                         "uncached_tpot_ms": 1e3 * statistics.median(without),
                         "speedup": statistics.median(without) / statistics.median(with_c)}
    res["cache_vs_no_cache"] = cache
    return res


def trained_section(args) -> dict:
    """Quality of bf16/int8 and speculative speedups on models trained on the embedded corpus."""
    from pathlib import Path

    from attnlab.config import TrainConfig
    from attnlab.data.tasks import make_task
    from attnlab.loading import load_any
    from attnlab.train import evaluate

    target_dir, draft_dir = Path(args.target), Path(args.draft)
    if not (target_dir / "manifest.json").exists() or not (draft_dir / "manifest.json").exists():
        return {"skipped": f"build {target_dir} and {draft_dir} first: python benchmarks/spec_models.py"}
    target, draft = load_any(target_dir), load_any(draft_dir)
    n_target = sum(p.numel() for p in target.model.parameters())  # before prepacking hides the matrices
    n_draft = sum(p.numel() for p in draft.model.parameters())
    task = make_task(TrainConfig(seq_len=256, batch_size=8, eval_batches=8))
    batches = task.eval_batches()
    quality = {}
    low = [dt for dt in ("bf16", "int8") if dt in args.dtypes]
    for dt in ("fp32", *low):
        m = set_precision(copy.deepcopy(target.model), dt)
        quality[dt] = evaluate(m, batches, "cpu")["val_loss"]
    for dt in low:
        quality[f"{dt}_relative_change"] = quality[dt] / quality["fp32"] - 1
    val = task.val_ids.tolist()
    prompts = [val[s:s + 200] for s in range(1000, 1000 + 8 * 9000, 9000)]  # 8 held-out code windows
    code_twice = val[5000:5150] * 2  # the same code twice: lookup pays only if the target copies it
    windows = most_repetitive_windows(val, 300, 4)  # held-out text where the most 8-grams recur
    spec = {}
    for dt in [d for d in ("fp32", "bf16") if d in args.dtypes]:  # the same precision for plain and speculative
        # Plain decoding is timed with the weights laid out for 1 row and for the verify pass's k+1 rows, and
        # the faster counts: the speedup is over the best plain decode of the same target, not a handicapped one.
        plain1 = set_precision(copy.deepcopy(target.model), dt)
        dm = set_precision(copy.deepcopy(draft.model), "fp32")  # small matrices: fp32 is the faster path
        for k in (3, 4, 5, 6):
            tk = set_precision(copy.deepcopy(target.model), dt, rows=k + 1)
            spec[f"{dt}_draft_k{k}"] = _spec_runs([plain1, tk], tk, prompts, args.spec_tokens, dict(k=k, draft=dm))
        for lo, hi in ((2, 4), (3, 8)):
            for k in (4, 8):
                tk = set_precision(copy.deepcopy(target.model), dt, rows=k + 1)
                how = dict(k=k, prompt_lookup=True, lookup_ngram=(lo, hi))
                spec[f"{dt}_lookup_ngram{lo}-{hi}_k{k}_repetitive"] = _spec_runs(
                    [plain1, tk], tk, [val[s:s + 300] for s in windows], args.spec_tokens, how)
                spec[f"{dt}_lookup_ngram{lo}-{hi}_k{k}_code_twice"] = _spec_runs(
                    [plain1, tk], tk, [code_twice], args.spec_tokens, how, rounds=2)
    # How much of the target's greedy output after the code-twice prompt copies the code's next bytes.
    plain_out = generate(plain1, code_twice, args.spec_tokens).tokens
    copy_rate = sum(a == b for a, b in zip(plain_out, val[5000:5150] * 2)) / len(plain_out)
    # The targets count fp32 runs only: there greedy output must be (and is checked to be) identical; in bf16
    # a near-tie can flip between the verify pass and a decode step (reported, not counted).
    exact = {name: v for name, v in spec.items() if name.startswith("fp32_") and v["identical_greedy_output"]}
    best_draft = max(((v["speedup"], name) for name, v in exact.items() if "_draft_" in name), default=(0.0, None))
    best_lookup = max(((v["speedup"], name) for name, v in exact.items() if name.endswith("_repetitive")),
                      default=(0.0, None))
    return {"target_params": n_target, "draft_params": n_draft, "held_out_loss": quality, "speculative": spec,
            "best_draft": best_draft[1], "best_lookup": best_lookup[1],
            "repetitive_windows": {"starts_in_held_out_split": windows, "tokens": 300,
                                   "share_of_8grams_seen_before": [repeat_share(val[s:s + 300]) for s in windows]},
            "code_twice_output_copies_the_code": copy_rate,
            "targets": {**{f"{dt}_loss_change_le_1pct": abs(quality[f"{dt}_relative_change"]) <= 0.01 for dt in low},
                        "speculative_draft_ge_1.5x": best_draft[0] >= 1.5,
                        "prompt_lookup_ge_1.5x": best_lookup[0] >= 1.5,
                        "fp32_greedy_output_identical": all(v["identical_greedy_output"] for name, v in spec.items()
                                                            if name.startswith("fp32_"))},
            "bf16_runs_with_identical_output": sum(v["identical_greedy_output"] for name, v in spec.items()
                                                   if name.startswith("bf16_"))}


def repeat_share(tokens: list[int], n: int = 8) -> float:
    """Share of the n-grams of `tokens` that already occurred earlier in it: how repetitive a text is."""
    seen, hits = set(), 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i:i + n])
        hits += gram in seen
        seen.add(gram)
    return hits / max(1, len(tokens) - n + 1)


def most_repetitive_windows(ids: list[int], length: int, count: int, stride: int = 50) -> list[int]:
    """Starts of the `count` non-overlapping windows with the highest repeat_share (chosen from the text
    alone, before any model sees it)."""
    ranked = sorted(range(0, len(ids) - length, stride), key=lambda s: -repeat_share(ids[s:s + length]))
    picked: list[int] = []
    for s in ranked:
        if all(abs(s - p) >= length for p in picked):
            picked.append(s)
            if len(picked) == count:
                break
    return picked


def _spec_runs(plain_models, target, prompts, n: int, how: dict, rounds: int = 1) -> dict:
    """Plain greedy decode (each of plain_models: the same weights in different layouts) and speculative decode
    of `target`, interleaved per prompt; speedup = the faster plain total / the speculative total;
    acceptance = accepted / proposed drafts."""
    from attnlab.engine.speculative import speculative_generate

    plain_s, spec_s, accepted, proposed, same = [0.0] * len(plain_models), 0.0, 0, 0, True
    for _ in range(rounds):
        for p in prompts:
            for j, m in enumerate(plain_models):
                a = generate(m, p, n)
                plain_s[j] += a.stats.total_s
            b = speculative_generate(target, p, n, **how)
            spec_s += b.stats.total_s
            accepted += round(b.stats.accepted * b.stats.proposed)
            proposed += b.stats.proposed
            same &= a.tokens == b.tokens
    tokens = n * len(prompts) * rounds
    return {"speedup": min(plain_s) / spec_s, "acceptance": accepted / max(1, proposed),
            "plain_ms_per_token": 1e3 * min(plain_s) / tokens,
            "plain_ms_per_token_by_layout": {f"rows{getattr(m, 'rows', 1)}": 1e3 * t / tokens
                                             for m, t in zip(plain_models, plain_s)},
            "speculative_ms_per_token": 1e3 * spec_s / tokens,
            "identical_greedy_output": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--spec-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="benchmarks/cache/spec-target")
    ap.add_argument("--draft", default="benchmarks/cache/spec-draft")
    ap.add_argument("--skip-trained", action="store_true")
    ap.add_argument("--skip-gpt2", action="store_true", help="only the trained-model section (quality, speculative)")
    ap.add_argument("--dtypes", help="comma-separated, from fp32,bf16,int8 (default: those native here, "
                                     "attnlab.runtime.fast_dtypes)")
    ap.add_argument("--out", default="benchmarks/results/decode_vs_hf.json")
    args = ap.parse_args()
    set_threads(args.threads)
    if args.dtypes:
        args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        for dt in args.dtypes:
            warn_if_emulated("decode_vs_hf", dt)
    else:
        args.dtypes = list(fast_dtypes("cpu"))
    args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]  # fp32 is every comparison's reference
    out = {"benchmark": "decode_vs_hf", "context": context(), "batch": 1, "prompt_tokens": 512,
           "new_tokens": args.new_tokens, "dtypes": args.dtypes}
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
        print(f"decode tok/s: HF fp32 {g['decode_hf_fp32']['tok_per_s']:.1f} | attnlab fp32 "
              f"{g['decode_fp32']['tok_per_s']:.1f} ({g['decode_fp32']['speedup_vs_hf_fp32']:.2f}x)"
              + "".join(f", {dt} {g[f'decode_{dt}']['speedup_vs_hf_fp32']:.2f}x" for dt in ("bf16", "int8")
                        if f"decode_{dt}" in g))
        print(f"ttft 512: {g['ttft_512']['attnlab_s']:.3f} s vs HF {g['ttft_512']['hf_s']:.3f} s; 1024: "
              f"{g['ttft_1024']['attnlab_s']:.3f} vs {g['ttft_1024']['hf_s']:.3f}")
        print("targets:", g["targets"])
    if not args.skip_trained:
        t = out["trained"] = trained_section(args)
        for name, v in t.get("speculative", {}).items():
            print(f"{name}: speedup {v['speedup']:.2f}x, acceptance {v['acceptance']:.2f}, "
                  f"identical {v['identical_greedy_output']}")
        print("targets:", t.get("targets", t))
    _keep_skipped_sections(args.out, out)
    write_json(args.out, out)


def _keep_skipped_sections(path: str, out: dict) -> None:
    """A run that skips a section keeps that section from the file's previous run, marked with its date."""
    import json
    from pathlib import Path

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

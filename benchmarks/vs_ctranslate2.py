"""attnlab's engine against CTranslate2, a production C++ inference engine, on the same GPT-2 small weights.

    python -m pip install -e '.[bench]'          # CTranslate2 and transformers: benchmark-only dependencies
    python benchmarks/vs_ctranslate2.py [--rounds 5] [--threads 2] [--quick]

The weights: Hugging Face's GPT-2 small built at random (seed 0) and saved with a made-up word-level vocabulary
(the converter needs a tokenizer; token i is "t<i>"); attnlab loads the folder, CTranslate2's own converter
converts it, and CTranslate2 quantizes on load (``compute_type``), as its users run it.

Rows: batch-1 decode after a 512-token prompt (ms per token) and the TTFT of that prompt; batched generation of
16 and of 64 prompts of 128 tokens, 64 new tokens each (output tokens per second); in each of fp32, int8 and bf16 that
both sides run natively here (attnlab's int8 needs native bf16 activations; CTranslate2 lists its compute types).
Each side runs its strongest CPU path: CTranslate2's ``generate_batch`` with the prompt
forwarded at once (``include_prompt_in_result=False``) and greedy search; attnlab's ``generate`` (the engine) with
its weights laid out for the rows a call decodes, and for each batch the KV cache (paged or contiguous) that ran
it faster on tuning prompts drawn apart from the reported ones (``choose_cache``; the JSON keeps both figures).

Each library runs in a process of its own (``Side``: this script with ``--side``, taking calls as JSON lines on its
stdin and answering the tokens on its stdout), built and warmed once: in one process, once CTranslate2 had run a
call, attnlab's 512-token int8 prefill took 280-400 ms where it had taken 230-260 before, for the rest of the
process, so the two libraries never share one. The clock, one for both sides: this process's time.perf_counter()
read around each whole call (common.timed_call), the request and the answer included (JSON of a few thousand token
ids: well under a millisecond). TTFT is a call for one token; decode per token = (a call for n tokens - the call for
one) / (n - 1). Every side runs every call shape once untimed first; the sides alternate each round
(common.round_order) and every ratio is the median of per-round ratios. The machine's bounds come from the same run,
measured before and after: the fp32 matmul peak, the bf16 and int8 ones when int8 runs, and the memory
bandwidth. Each batch-1 decode row is also a share of its bound (weight bytes read per token over the bandwidth,
against the measured step), each batched row and each TTFT a share of the fp32 peak (model FLOPs of prompts and
outputs over wall time; int8 rows can pass 1) and, in int8, of the best of the three peaks, which is the share an int8
batch's target judges; the fp32 TTFT row also says how far CTranslate2's is from the peak's bound, the most any engine
could beat it by on this machine. Greedy tokens are compared in fp32. Writes
benchmarks/results/vs_ctranslate2.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.models.hf import load_hf
from attnlab.runtime import fast_dtypes
from common import (JsonLinesProcess, context, matmul_peak_flops, memory_bandwidth, product_peak_ops, round_order,
                    round_ratios, set_threads, summarize, timed_call, write_json)
from decode_vs_hf import decode_bytes_per_token

CT2_TYPES = {"fp32": "float32", "int8": "int8", "bf16": "bfloat16"}


def gpt2_folder(quick: bool) -> tuple[str, int]:
    """A random GPT-2 (small, or tiny with --quick) saved with a word-level tokenizer: (folder, vocab size)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1024, n_layer=2, n_embd=64, n_head=4, n_positions=1024,
                     bos_token_id=1023, eos_token_id=1023) if quick else GPT2Config()
    folder = tempfile.mkdtemp(prefix="vs_ct2_")
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    save_word_tokenizer(folder, cfg.vocab_size)
    return folder, cfg.vocab_size


def save_word_tokenizer(folder: str, vocab: int) -> None:
    """Write a word-level tokenizer into ``folder`` (token i is "t<i>", the last token ends text): CTranslate2's
    converter reads the vocabulary from a tokenizer, and its generator takes tokens as strings."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    end = f"t{vocab - 1}"
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token=end))
    PreTrainedTokenizerFast(tokenizer_object=words, bos_token=end, eos_token=end, unk_token=end).save_pretrained(folder)


def convert_for_ct2(folder: str) -> str:
    """``folder`` (a Hugging Face GPT-2 with a tokenizer) converted by CTranslate2's own converter: its directory."""
    from ctranslate2.converters import TransformersConverter

    ct2_dir = str(Path(tempfile.mkdtemp(prefix="vs_ct2_out_")) / "model")
    TransformersConverter(folder).convert(ct2_dir, force=True)
    return ct2_dir


def generation_flops(nonembed: int, n_layers: int, dim: int, vocab: int, prompt: int, new: int) -> float:
    """One sequence: 2 N T + 2 L T^2 d for the prompt (causal QK^T and AV) and its last row's LM head, then per output
    token at position p: 2 N + 4 L d p + 2 d V."""
    pre = 2 * nonembed * prompt + 2 * n_layers * prompt * prompt * dim + 2 * dim * vocab
    return pre + sum(2 * nonembed + 4 * n_layers * dim * p + 2 * dim * vocab for p in range(prompt, prompt + new - 1))


def ct2_side(ct2_dir: str, dtype: str, threads: int):
    """CTranslate2's generator in ``dtype``: fn(prompts, n) -> token ids of each continuation."""
    import ctranslate2

    gen = ctranslate2.Generator(ct2_dir, device="cpu", compute_type=CT2_TYPES[dtype], intra_threads=threads,
                                inter_threads=1)

    def run(prompts: list[list[int]], n: int) -> list[list[int]]:
        out = gen.generate_batch([[f"t{i}" for i in p] for p in prompts], max_length=n, min_length=n, sampling_topk=1,
                                 include_prompt_in_result=False, max_batch_size=0)
        ids = [r.sequences_ids[0] for r in out]
        if any(len(s) != n for s in ids):
            raise RuntimeError(f"CTranslate2 returned {sorted({len(s) for s in ids})} tokens, not {n}: its max_length "
                               "semantics differ from this benchmark's assumption")
        return ids
    return run


def attnlab_side(model, paged: bool = False):
    def run(prompts: list[list[int]], n: int) -> list[list[int]]:
        return [c.tokens for c in generate(model, prompts, n, paged=paged).completions]
    return run


TUNING_SEED, TUNING_ROUNDS = 7, 2  # the tuning prompts' seed (the reported ones use 1), alternations per cache


def choose_cache(model, prompts: list[list[int]], new: int) -> dict:
    """Paged or contiguous KV cache for a batch, whichever generates ``prompts`` faster (each warmed, then
    TUNING_ROUNDS alternations, median): {"paged": bool, "tok_per_s": {"paged": ..., "contiguous": ...}}."""
    runs = {"paged": attnlab_side(model, paged=True), "contiguous": attnlab_side(model, paged=False)}
    for fn in runs.values():
        fn(prompts, new)
    took = {name: [] for name in runs}
    for r in range(TUNING_ROUNDS):
        for name in round_order(list(runs), r):
            took[name].append(timed_call(lambda: runs[name](prompts, new))[0])
    rate = {name: len(prompts) * new / statistics.median(t) for name, t in took.items()}
    return {"paged": rate["paged"] >= rate["contiguous"], "tok_per_s": rate}


def prompts_for(vocab: int, batches: list[int], quick: bool) -> dict:
    """The prompts every side runs, the same in each process: "single" (one prompt of 512 tokens, 128 with
    --quick), "batches" {B: B prompts of 128} (seed 1) and "tuning" {B: ...} (TUNING_SEED, for choose_cache)."""
    g = torch.Generator().manual_seed(1)
    single = [torch.randint(0, vocab, (128 if quick else 512,), generator=g).tolist()]
    batches_ = {B: [torch.randint(0, vocab, (128,), generator=g).tolist() for _ in range(B)] for B in batches}
    tg = torch.Generator().manual_seed(TUNING_SEED)
    tuning = {B: [torch.randint(0, vocab, (128,), generator=tg).tolist() for _ in range(B)] for B in batches}
    return {"single": single, "batches": batches_, "tuning": tuning}


class Side(JsonLinesProcess):
    """One library's models in a process of its own (``side_main``), built and warmed there; a call sends
    (dtype, batch, prompts, n) and returns the continuations' token ids. ``setup``: what the process reported once
    built (attnlab: bytes per decoded token and each batch's cache choice)."""

    def __init__(self, lib: str, folder: str, dtypes: list[str], args):
        super().__init__([sys.executable, __file__, "--side", lib, "--folder", folder, "--dtypes", ",".join(dtypes),
                          "--threads", str(args.threads), "--batches", ",".join(map(str, args.batches)),
                          "--batch-new-tokens", str(args.batch_new_tokens)] + (["--quick"] if args.quick else []),
                         f"the {lib} side")
        self.setup = self.answer()

    def __call__(self, dtype: str, batch: int, prompts: list[list[int]], n: int) -> list[list[int]]:
        return self.request({"dtype": dtype, "batch": batch, "prompts": prompts, "n": n})["tokens"]


def side_main(args) -> None:
    """Child: build one library's side for every dtype (attnlab: a model laid out for one row, and one per batch
    with the KV cache choose_cache picks), report its setup, then answer calls until stdin closes."""
    answer, sys.stdout = sys.stdout, sys.stderr  # only answers on the pipe: libraries' prints go to stderr
    set_threads(args.threads)
    dtypes = args.dtypes.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    runs, setup = {}, {}
    if args.side == "attnlab":
        base, cfg, _, _ = load_hf(args.folder)
        tuning = prompts_for(cfg.vocab_size, batches, args.quick)["tuning"]
        setup = {"bytes_per_token": {}, "kv_bytes_per_token": {}, "caches": {}}
        for dt in dtypes:
            one = set_precision(copy.deepcopy(base), dt, rows=1)
            setup["bytes_per_token"][dt] = decode_bytes_per_token(one)
            setup["kv_bytes_per_token"][dt] = one.new_state(1, 1).bytes_per_token
            runs[(dt, 1)] = attnlab_side(one)
            for B in batches:
                model = set_precision(copy.deepcopy(base), dt, rows=min(B, 16), varying=True)
                setup["caches"][f"batch_{B}_{dt}"] = choice = choose_cache(model, tuning[B], args.batch_new_tokens)
                runs[(dt, B)] = attnlab_side(model, paged=choice["paged"])
    else:
        ct2_dir = convert_for_ct2(args.folder)
        for dt in dtypes:
            gen = ct2_side(ct2_dir, dt, args.threads)
            runs.update({(dt, B): gen for B in [1, *batches]})
    answer.write(json.dumps(setup) + "\n")
    answer.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = {"tokens": runs[(req["dtype"], req["batch"])](req["prompts"], req["n"])}
        except Exception as e:  # reported to the parent, which stops
            res = {"error": f"{args.side}: {type(e).__name__}: {e}"}
        answer.write(json.dumps(res) + "\n")
        answer.flush()


def measure(args, dtypes: list[str]) -> dict:
    folder, vocab = gpt2_folder(args.quick)
    base, cfg, _, _ = load_hf(folder)
    nonembed = sum(p.numel() for name, p in base.named_parameters() if "tok_emb" not in name and "pos_enc" not in name)
    del base
    p = prompts_for(vocab, args.batches, args.quick)
    single, batches = p["single"], p["batches"]
    n, new = args.new_tokens, args.batch_new_tokens

    libs = {lib: Side(lib, folder, dtypes, args) for lib in ("attnlab", "ctranslate2")}
    ours = libs["attnlab"].setup
    for name, choice in ours["caches"].items():
        print(f"{name}: {'paged' if choice['paged'] else 'contiguous'} cache "
              f"({', '.join(f'{k} {v:.0f} tok/s' for k, v in choice['tok_per_s'].items())} on tuning prompts)",
              flush=True)
    sides = {(dt, lib, B): (lambda ps, k, side=side, dt=dt, B=B: side(dt, B, ps, k))
             for dt in dtypes for lib, side in libs.items() for B in [1, *args.batches]}
    calls = {1: [(single, 1), (single, n)], **{B: [(batches[B], new)] for B in args.batches}}
    try:
        for (dt, lib, B), fn in sides.items():  # warm-up: every side, every call shape it is timed on
            for prompts, k in calls[B]:
                fn(prompts, k)
        times = {key: [] for key in sides}
        tokens = {}
        rounds = args.rounds
        for r in range(rounds):
            for key in round_order(list(sides), r):
                dt, lib, B = key
                if B == 1:
                    t1, _ = timed_call(lambda: sides[key](single, 1))
                    tn, tokens[key] = timed_call(lambda: sides[key](single, n))
                    times[key].append((t1, (tn - t1) / (n - 1)))
                else:
                    tb, _ = timed_call(lambda: sides[key](batches[B], new))
                    times[key].append(tb)
            print(f"round {r + 1}/{rounds} done", flush=True)
    finally:
        for side in libs.values():
            side.close()
    return {"times": times, "tokens": tokens, "bytes_per_token": ours["bytes_per_token"],
            "kv_bytes_per_token": ours["kv_bytes_per_token"], "caches": ours["caches"],
            "nonembed": nonembed, "cfg": cfg,
            "vocab": vocab, "short": len(single[0]), "n": n, "new": new}


def summarize_rows(m: dict, dtypes: list[str], batches: list[int], peak: float, bandwidth: float,
                   int8_peak: float = 0.0) -> dict:
    """The table's rows from the measured times; ``peak``: the fp32 product's, ``int8_peak``: the best of the bf16
    and int8 products' (product_peak_ops), what an int8 model's products run on besides fp32."""
    times, cfg = m["times"], m["cfg"]
    rows = {}
    for dt in dtypes:
        # An int8 model's product runs as integers (w8a8) or on a weight widened to its bf16 activations, whichever is
        # faster for its shape: the best of the peaks is what an int8 row can reach here, and its share the one judged.
        own = max(peak, int8_peak) if dt == "int8" else None
        ours, theirs = times[(dt, "attnlab", 1)], times[(dt, "ctranslate2", 1)]
        bound = m["bytes_per_token"][dt] / bandwidth
        # A step also reads its sequence's keys and values (at the timed steps' mean context: the prompt and half the
        # new tokens), a share of the bytes that grows as the weights narrow, so the weights-only bound can sit below
        # what a step must read; this bound says how near a step is to those bytes.
        kv = m["kv_bytes_per_token"][dt] * (m["short"] + (m["n"] - 1) / 2)
        # A prefill is matmul-bound: in fp32 its FLOPs at the fp32 peak bound its time, so CTranslate2's TTFT over that
        # bound is the most any engine could beat it by here. Other dtypes' arithmetic can run past the fp32 peak:
        # their share of it is shown, and no bound.
        prompt_flops = generation_flops(m["nonembed"], cfg.n_layers, cfg.dim, m["vocab"], m["short"], 1)
        for what, i in (("ttft", 0), ("decode", 1)):
            a, c = [x[i] for x in ours], [x[i] for x in theirs]
            row = rows[f"{what}_{m['short']}_{dt}"] = {
                "attnlab_ms": 1e3 * statistics.median(a), "ctranslate2_ms": 1e3 * statistics.median(c),
                "attnlab_ms_range": [1e3 * min(a), 1e3 * max(a)], "ctranslate2_ms_range": [1e3 * min(c), 1e3 * max(c)],
                "attnlab_speedup": round_ratios(c, a)}  # CTranslate2's time over attnlab's, per round
            if what == "ttft":
                row["prompt_gflop"] = prompt_flops / 1e9
                row["attnlab_share_of_peak"] = prompt_flops / peak / statistics.median(a)
                row["ctranslate2_share_of_peak"] = prompt_flops / peak / statistics.median(c)
                if own:
                    row["attnlab_share_of_int8_peak"] = prompt_flops / own / statistics.median(a)
                    row["ctranslate2_share_of_int8_peak"] = prompt_flops / own / statistics.median(c)
                if dt == "fp32":
                    row["peak_bound_ms"] = 1e3 * prompt_flops / peak
                    row["speedup_over_ctranslate2_at_peak"] = statistics.median(c) / (prompt_flops / peak)
            if what == "decode":
                row["bandwidth_bound_ms"] = 1e3 * bound
                row["attnlab_share_of_bound"] = bound / statistics.median(a)
                row["ctranslate2_share_of_bound"] = bound / statistics.median(c)
                row["kv_cache_mb_read"] = kv / 1e6
                row["bound_with_cache_ms"] = 1e3 * (bound + kv / bandwidth)
                row["attnlab_share_of_bound_with_cache"] = (bound + kv / bandwidth) / statistics.median(a)
        flops_per_seq = generation_flops(m["nonembed"], cfg.n_layers, cfg.dim, m["vocab"], 128, m["new"])
        for B in batches:
            a, c = times[(dt, "attnlab", B)], times[(dt, "ctranslate2", B)]
            out_tokens = B * m["new"]
            rows[f"batch_{B}_{dt}"] = {
                "attnlab_tok_per_s": out_tokens / statistics.median(a),
                "ctranslate2_tok_per_s": out_tokens / statistics.median(c),
                "attnlab_s": summarize(a), "ctranslate2_s": summarize(c),
                "attnlab_speedup": round_ratios(c, a),
                "attnlab_share_of_peak": B * flops_per_seq / statistics.median(a) / peak,
                "ctranslate2_share_of_peak": B * flops_per_seq / statistics.median(c) / peak}
            if own:
                rows[f"batch_{B}_{dt}"].update({
                    "attnlab_share_of_int8_peak": B * flops_per_seq / statistics.median(a) / own,
                    "ctranslate2_share_of_int8_peak": B * flops_per_seq / statistics.median(c) / own})
    return rows


def targets_of(rows: dict) -> dict:
    """Issue 32's goals, each row against its own: 1.3x CTranslate2; a batch at 70% of its dtype's peak (an int8
    batch, of the best product it can run on); a batch-1 decode at 90% of its bandwidth bound."""
    targets = {f"{name}_ge_1.3x_ctranslate2": row["attnlab_speedup"]["median"] >= 1.3 for name, row in rows.items()}
    share = lambda row: row.get("attnlab_share_of_int8_peak", row["attnlab_share_of_peak"])
    targets.update({f"{name}_ge_70pct_of_peak": share(row) >= 0.7 for name, row in rows.items()
                    if name.startswith("batch_")})
    targets.update({f"{name}_ge_90pct_of_bandwidth_bound": row["attnlab_share_of_bound"] >= 0.9
                    for name, row in rows.items() if name.startswith("decode_")})
    return targets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32, help="decode tokens timed after the batch-1 prompt")
    ap.add_argument("--batch-new-tokens", type=int, default=64)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--dtypes", help="comma-separated from fp32,int8,bf16 (default: each that both sides run natively "
                                     "here: attnlab.runtime's fast dtypes and CTranslate2's compute types)")
    ap.add_argument("--quick", action="store_true", help="smoke run: a tiny GPT-2, 2 rounds, few tokens")
    ap.add_argument("--out", default="benchmarks/results/vs_ctranslate2.json")
    ap.add_argument("--side", choices=("attnlab", "ctranslate2"), help=argparse.SUPPRESS)  # a Side's process
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        return side_main(args)
    try:
        import ctranslate2
    except ImportError:
        raise SystemExit("CTranslate2 is not installed: python -m pip install -e '.[bench]'") from None
    if args.quick:
        args.rounds, args.new_tokens, args.batch_new_tokens, args.batches = 2, 4, 8, "4"
    args.batches = [int(b) for b in args.batches.split(",")]
    set_threads(args.threads)
    native = fast_dtypes("cpu")
    theirs = ctranslate2.get_supported_compute_types("cpu")
    both = [d for d in ("fp32", "int8", "bf16") if d in native and CT2_TYPES[d] in theirs]  # native on both sides
    dtypes = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else both
    if set(dtypes) - set(both):
        raise SystemExit(f"--dtypes {','.join(sorted(set(dtypes) - set(both)))}: not native here on both sides "
                         f"(attnlab: {', '.join(native)}; CTranslate2 {ctranslate2.__version__}: "
                         f"{', '.join(sorted(theirs))}); choose from {','.join(both)}")
    low = ("bf16", "int8") if "int8" in dtypes else ()  # the products an int8 model runs besides fp32
    peak0, low0, bw0 = matmul_peak_flops(), {d: product_peak_ops(d) for d in low}, memory_bandwidth()
    m = measure(args, dtypes)
    peak1, low1, bw1 = matmul_peak_flops(), {d: product_peak_ops(d) for d in low}, memory_bandwidth()
    peak, bw = max(peak0, peak1), max(bw0, bw1)  # the bound: the best the machine showed in this run
    rows = summarize_rows(m, dtypes, args.batches, peak, bw, max([*low0.values(), *low1.values()], default=0.0))
    fp32_same = (m["tokens"][("fp32", "attnlab", 1)] == m["tokens"][("fp32", "ctranslate2", 1)]
                 if "fp32" in dtypes else None)
    targets = targets_of(rows)
    out = {"benchmark": "vs_ctranslate2", "context": context(), "ctranslate2": ctranslate2.__version__,
           "quick": args.quick, "rounds": args.rounds, "threads": args.threads, "dtypes": dtypes,
           "clock": "time.perf_counter() read by the benchmark around each whole call (the request to the side's "
                    "process and its answer), on both sides",
           "processes": "each library in a process of its own, built and warmed once",
           "order": "sides alternate each round (forward, then reversed)",
           "calibration": {"matmul_peak_flops": [peak0, peak1], "bandwidth_bytes_per_s": [bw0, bw1],
                           **{f"{d}_matmul_peak_ops": [low0[d], low1[d]] for d in low}},
           "greedy_tokens_identical_fp32": fp32_same, "rows": rows, "targets": targets,
           "attnlab_batch_cache": {"chosen_on": f"tuning prompts (seed {TUNING_SEED}; the reported ones: seed 1)",
                                   **m["caches"]}}
    for name, row in rows.items():
        s = row["attnlab_speedup"]
        print(f"{name}: attnlab {s['median']:.2f}x CTranslate2 (rounds {s['min']:.2f}-{s['max']:.2f})")
    print("greedy tokens identical in fp32:", fp32_same)
    print("targets:", targets)
    write_json(args.out, out)


if __name__ == "__main__":
    main()

"""The ``attnlab`` command: argparse subcommands, each body a call into the library.

Invalid usage and bad input exit with code 2 and a one-line reason on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from attnlab.errors import AttnlabError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the whole usage block)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _model_args(p: argparse.ArgumentParser) -> None:
    from attnlab.config import FAMILIES, MLPS, NORMS, PRESETS
    from attnlab.models.attention import KERNELS
    from attnlab.models.positional import POSITIONAL

    g = p.add_argument_group("model")
    g.add_argument("--preset", default="default", choices=list(PRESETS), help="starting point for the model fields")
    g.add_argument("--family", choices=FAMILIES)
    g.add_argument("--kernel", choices=list(KERNELS))
    g.add_argument("--pos", choices=list(POSITIONAL))
    g.add_argument("--dim", type=int)
    g.add_argument("--n-layers", type=int)
    g.add_argument("--n-heads", type=int)
    g.add_argument("--n-kv-heads", type=int)
    g.add_argument("--mlp", choices=MLPS)
    g.add_argument("--norm", choices=NORMS)
    g.add_argument("--max-seq-len", type=int)
    g.add_argument("--dropout", type=float)
    g.add_argument("--fused", action="store_true", default=None, help="recurrent families: torch's fused kernel")


def _model_config(args):
    from attnlab.config import PRESETS, ModelConfig

    fields = dict(PRESETS[args.preset])
    for name in ("family", "kernel", "pos", "dim", "n_layers", "n_heads", "n_kv_heads", "mlp", "norm",
                 "max_seq_len", "dropout", "fused"):
        val = getattr(args, name)
        if val is not None:
            fields[name] = val
    return ModelConfig(**fields)


def _train_config(args):
    from attnlab.config import TrainConfig

    fields = {}
    for name in ("task", "data", "tokenizer", "bpe_vocab_size", "synth_vocab", "n_pairs", "steps", "batch_size",
                 "seq_len", "lr", "warmup_steps", "seed", "device", "save_every", "eval_every", "log_every",
                 "grad_clip"):
        val = getattr(args, name)
        if val is not None:
            fields[name] = val
    return TrainConfig(**fields)


def _set_threads(n: int | None) -> None:
    import torch

    if n:
        torch.set_num_threads(n)
    torch.set_flush_denormal(True)  # denormals made a model 14x slower on these CPUs (MEASURING.md)


def cmd_train(args) -> int:
    from attnlab.train import train

    _set_threads(args.threads)
    summary = train(_model_config(args), _train_config(args), args.out, resume=args.resume,
                    overwrite=args.overwrite, progress=not args.quiet)
    print(json.dumps(summary) if args.json else
          f"trained {summary['params']:,} params to step {summary['final_step']} in {summary['train_s']:.1f} s: "
          f"loss {summary.get('loss', float('nan')):.4f}, held-out loss {summary.get('val_loss', float('nan')):.4f}; "
          f"checkpoint in {args.out}")
    return 0


def _read_prompt(args) -> str:
    if args.prompt is not None:
        text = args.prompt
        try:
            text.encode("utf-8")  # argv bytes that are not UTF-8 arrive as lone surrogates
        except UnicodeEncodeError:
            raise AttnlabError("--prompt is not valid UTF-8 text; fix the terminal's encoding or pipe the text "
                               "through standard input as UTF-8") from None
        return text
    raw = sys.stdin.buffer.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AttnlabError(f"standard input is not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                           "convert it to UTF-8 first") from None


def _cache_dtype(name: str | None):
    import torch

    return None if name is None else {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def cmd_generate(args) -> int:
    from attnlab.engine import SamplingParams, generate
    from attnlab.engine.quantize import set_precision
    from attnlab.engine.speculative import speculative_generate
    from attnlab.loading import load_any

    _set_threads(args.threads)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed)
    if args.draft and args.prompt_lookup:
        raise AttnlabError("choose one proposer: --draft DRAFT or --prompt-lookup, not both")
    if (args.draft or args.prompt_lookup) and (args.no_cache or args.stream):
        raise AttnlabError("speculative decoding needs the KV cache and returns whole rounds: drop --no-cache/--stream")
    prompt = _read_prompt(args)
    target = load_any(args.checkpoint)
    if target.tokenizer is None:
        raise AttnlabError(f"{args.checkpoint} has no tokenizer.json, so text cannot be encoded; add one")
    model = set_precision(target.model, args.dtype)
    ids = target.tokenizer.encode(prompt)
    stop_tokens = target.stop_tokens if not args.ignore_eos else []
    common = dict(stop_tokens=stop_tokens, stop_strings=args.stop or (), tokenizer=target.tokenizer,
                  truncate=args.truncate)
    if args.draft or args.prompt_lookup:
        draft = set_precision(load_any(args.draft).model, args.dtype) if args.draft else None
        out = speculative_generate(model, ids, args.max_new_tokens, k=args.k, draft=draft,
                                   prompt_lookup=args.prompt_lookup, params=params, **common)
    elif args.stream:
        from attnlab.engine.engine import Engine

        cache_dtype = _cache_dtype(args.cache_dtype)
        out = None
        for event in Engine(model, target.tokenizer, cache_dtype=cache_dtype).stream(
                ids, args.max_new_tokens, params, stop_tokens, args.stop or (), args.truncate):
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            out = event.output or out
        if not args.json:
            sys.stdout.write("\n")
    else:
        cache_dtype = _cache_dtype(args.cache_dtype)
        out = generate(model, ids, args.max_new_tokens, params, use_cache=not args.no_cache, cache_dtype=cache_dtype,
                       **common)
    comp, st = out.completions[0], out.stats
    if args.json:
        print(json.dumps({"text": comp.text, "tokens": comp.tokens, "logprobs": comp.logprobs,
                          "finish_reason": comp.finish_reason, **st.to_dict(), "dtype": args.dtype}))
    else:
        if not args.stream:
            print(comp.text)
        extra = f", accepted {st.accepted:.0%} of drafts" if st.accepted is not None else ""
        print(f"[{st.prompt_tokens} prompt tokens; ttft {st.ttft_s * 1e3:.1f} ms; {st.decode_tok_per_s:.1f} tok/s decode; "
              f"cache {st.state_bytes:,} bytes{extra}]", file=sys.stderr)
    return 0


def describe(cfg) -> dict:
    """Parameter count and state size for a config, built on the meta device (no memory)."""
    import torch

    from attnlab.models import build_model, count_params

    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    if cfg.is_recurrent:
        fixed = cfg.n_layers * cfg.dim * 4 * (2 if cfg.family == "lstm" else 1)
        state = {"state_bytes_per_token": 0, "state_bytes_fixed": fixed}
    else:
        state = {"state_bytes_per_token": 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4,
                 "state_bytes_fixed": 0}
    return {"params": count_params(model), **state, "dtype": "fp32", "config": cfg.to_dict()}


def cmd_info(args) -> int:
    from attnlab.config import PRESETS, RunConfig, preset

    path = Path(args.target)
    if path.is_dir():
        from attnlab.checkpoint import verify

        verify(path)
        cfg = RunConfig.load(path / "config.json").model
    elif path.suffix == ".json" and path.exists():
        cfg = RunConfig.load(path).model
    elif args.target in PRESETS:
        cfg = preset(args.target)
    else:
        raise AttnlabError(f"{args.target!r} is neither a checkpoint folder nor a preset; presets: "
                           f"{', '.join(PRESETS)}")
    info = describe(cfg)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{args.target}: {cfg.family}, {info['params']:,} parameters")
    if cfg.is_recurrent:
        print(f"  state: {info['state_bytes_fixed']:,} bytes (fp32), the same at any context length")
    else:
        print(f"  KV cache: {info['state_bytes_per_token']:,} bytes per token (fp32), "
              f"{info['state_bytes_per_token'] * cfg.max_seq_len:,} at max_seq_len {cfg.max_seq_len}")
    print("  config: " + json.dumps(cfg.to_dict()))
    return 0


def cmd_demo(args) -> int:
    """The README's main job for now: train the default transformer on the embedded corpus, then sample."""
    from attnlab.config import TrainConfig, preset
    from attnlab.engine import SamplingParams, generate
    from attnlab.loading import load_any
    from attnlab.train import train

    _set_threads(args.threads)
    t0 = time.perf_counter()
    tcfg = TrainConfig(steps=args.steps, batch_size=16, seq_len=128, eval_every=max(1, args.steps // 4),
                       save_every=args.steps, seed=args.seed)
    print(f"attnlab demo: training the default transformer on the embedded corpus (Python's stdlib sources), "
          f"{args.steps} steps", flush=True)
    summary = train(preset("default"), tcfg, args.out, overwrite=True, progress=not args.quiet)
    loaded = load_any(args.out)
    prompt = "def "
    out = generate(loaded.model, loaded.tokenizer.encode(prompt), 200,
                   SamplingParams(temperature=0.8, top_k=40, seed=args.seed), tokenizer=loaded.tokenizer)
    res = out.stats
    wall = time.perf_counter() - t0
    print(f"\nmodel: {summary['params']:,} params; trained in {summary['train_s']:.1f} s at "
          f"{summary['tok_per_s']:,.0f} tokens/s; held-out loss {summary['val_loss']:.3f} "
          f"(perplexity {summary['val_ppl']:.2f} per byte)")
    print(f"sample ({res.prompt_tokens}-token prompt, {res.new_tokens} new tokens): time-to-first-token "
          f"{res.ttft_s * 1e3:.1f} ms, {res.decode_tok_per_s:.0f} tokens/s decode, KV cache {res.state_bytes:,} bytes")
    print("-" * 60)
    print(prompt + out.completions[0].text)
    print("-" * 60)
    print(f"total wall time {wall:.1f} s; checkpoint in {args.out}")
    return 0


def _fmt(n: float, unit: str = "") -> str:
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def cmd_cost(args) -> int:
    from attnlab.cost import Workload, compare, estimate, resolve
    from attnlab.cost import hardware

    _set_threads(args.threads)
    if args.validate:
        from attnlab.cost.validate import validate

        rows = validate(refresh=args.refresh)
        if args.json:
            print(json.dumps([{k: r[k] for k in ("model", "params", "phase", "predicted_s", "measured_s", "error",
                                                 "ops")} for r in rows]))
        else:
            print(f"{'model':14s} {'phase':8s} {'predicted':>12s} {'measured':>12s} {'error':>8s}")
            for r in rows:
                print(f"{r['model']:14s} {r['phase']:8s} {r['predicted_s'] * 1e3:10.2f}ms {r['measured_s'] * 1e3:10.2f}ms "
                      f"{r['error']:+8.1%}")
            print(f"local spec: {rows[0]['hardware']['source']}")
        return 0
    if args.model is None:
        raise AttnlabError("give a MODEL (preset, checkpoint folder or config.json), or --validate")
    arch = resolve(args.model)
    if args.compare:
        short, long = args.compare
        res = compare(arch, short, long, args.dtype)
        if args.json:
            print(json.dumps(res))
        else:
            print(f"{arch.name}: prefill FLOPs from {short:,} to {long:,} tokens")
            for part, v in res["parts"].items():
                print(f"  {part:22s} {_fmt(v['short_flops'], 'FLOP'):>14s} -> {_fmt(v['long_flops'], 'FLOP'):>14s}  "
                      f"x{v['factor']:,.1f}")
        return 0
    hw = hardware.get(args.hardware, refresh=args.refresh)
    res = estimate(arch, Workload(args.prompt_tokens, args.output_tokens, args.batch, args.dtype), hw,
                   allow_beyond_context=args.allow_beyond_context,
                   memory_budget=args.memory_gb * 1e9 if args.memory_gb else None)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{arch.name} on {hw.name} ({args.dtype}, batch {args.batch}): {res['params']:,} parameters")
    print(f"  {'part':22s} {'prefill':>14s} {'decode/token':>14s}")
    for part in ("qkv_out_projections", "attention", "mlp", "lm_head", "total"):
        print(f"  {part:22s} {_fmt(res['prefill_flops_by_part'][part], 'FLOP'):>14s} "
              f"{_fmt(res['decode_flops_by_part'][part], 'FLOP'):>14s}")
    print(f"  bytes moved            {_fmt(res['prefill_bytes']['total'], 'B'):>14s} "
          f"{_fmt(res['decode_bytes_per_token']['total'], 'B'):>14s}")
    print(f"  bound by               {res['prefill_bound']:>14s} {res['decode_bound']:>14s}")
    print(f"time to first token {res['ttft_s'] * 1e3:,.1f} ms; time per output token {res['tpot_s'] * 1e3:,.2f} ms "
          f"({res['decode_tok_per_s']:,.1f} tok/s); an output token costs {res['output_over_input_cost']:,.0f}x "
          "an input token")
    print(f"KV cache {_fmt(res['kv_cache_bytes_per_token'], 'B')}/token, {_fmt(res['kv_cache_bytes'], 'B')} in total; "
          f"memory {_fmt(res['memory_bytes'], 'B')}; longest context in {_fmt(args.memory_gb * 1e9 if args.memory_gb else hw.memory_bytes, 'B')}: "
          f"{res['max_context_tokens']:,} tokens")
    print(f"attention overtakes the MLP at {res['attention_mlp_crossover_tokens']:,.0f} tokens; sequential depth "
          f"{res['depth']['prefill']} layer steps for the prompt, {res['depth']['decode_all_outputs']:,} for the outputs")
    return 0


def cmd_trace(args) -> int:
    import torch

    from attnlab.config import ModelConfig, PRESETS, preset
    from attnlab.cost.trace import trace
    from attnlab.models import build_model

    _set_threads(args.threads)
    if args.seq_len <= 0:
        raise AttnlabError(f"--seq-len {args.seq_len} must be > 0")
    if args.model is None and args.family is None:
        raise AttnlabError("give a MODEL or --family F")
    if args.model is not None:
        path = Path(args.model)
        if args.model in PRESETS:
            cfg = preset(args.model)
        elif path.is_dir() or path.suffix == ".json":
            from attnlab.models.hf import config_from_hf
            from attnlab.config import RunConfig

            cfg_path = path / "config.json" if path.is_dir() else path
            data = json.loads(cfg_path.read_text())
            cfg = config_from_hf(data, str(cfg_path)) if "model_type" in data else RunConfig.from_dict(data).model
        else:
            from attnlab.cost.arch import PRESETS as COST_PRESETS
            from attnlab.models.hf import config_from_hf

            if args.model not in COST_PRESETS:
                raise AttnlabError(f"unknown model {args.model!r}; presets: {', '.join(list(PRESETS) + list(COST_PRESETS))}")
            cfg = config_from_hf(COST_PRESETS[args.model], args.model)
    else:
        cfg = ModelConfig(family=args.family, dim=args.dim, n_layers=args.n_layers, n_heads=args.n_heads,
                          kernel=args.kernel, max_seq_len=max(args.seq_len, 1024))
    if not cfg.is_recurrent and cfg.pos == "learned" and args.seq_len > cfg.max_seq_len:
        raise AttnlabError(f"--seq-len {args.seq_len} is above the model's context {cfg.max_seq_len}")
    with torch.device("meta"):  # shapes only: any size traces without memory
        model = build_model(cfg, device="meta")
    res = trace(model, torch.zeros(1, args.seq_len, dtype=torch.long, device="meta"))
    out = {"family": cfg.family, "seq_len": args.seq_len, **res.to_dict()}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{cfg.family} at T={args.seq_len}: work {res.flops:,} FLOPs in {res.ops:,} ops; depth {res.depth:,} "
              "dependent ops")
    return 0


def cmd_bench(args) -> int:
    from attnlab.bench import bench_attention, growth_exponent

    _set_threads(args.threads)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    try:
        lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    except ValueError:
        raise AttnlabError(f"--seq-lens {args.seq_lens!r} must be comma-separated integers, e.g. 1024,4096") from None
    show = None if args.json else (lambda r: print(
        f"{r['kernel']:13s} T={r['seq_len']:>6d}  " + (f"{r['time_s'] * 1e3:10.1f} ms  {r['peak_bytes'] / 2**20:9.1f} MiB"
                                                      if r["status"] == "ok" else r["status"]), flush=True))
    rows = bench_attention(kernels, lens, args.heads, args.head_dim, args.repeats, args.budget_gb * 2**30,
                           args.dtype, args.threads, progress=show)
    if args.json:
        print(json.dumps(rows))
    else:
        for k in kernels:
            e = growth_exponent(rows, k)
            if e is not None:
                print(f"{k}: time grows as T^{e:.2f}")
    return 0


def cmd_report(args) -> int:
    from attnlab.report import load_results, run_report, write_report

    _set_threads(args.threads)
    if args.from_json:
        results = load_results(args.from_json)
    else:
        only = None
        if args.only:
            try:
                only = [int(x) for x in args.only.split(",") if x.strip()]
            except ValueError:
                raise AttnlabError(f"--only {args.only!r} must be claim numbers, e.g. 1,4,10") from None
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise AttnlabError("--device cuda but torch sees no CUDA device; use --device cpu")

        def progress(exp, entry):
            if entry is None:
                print(f"[{exp.id:2d}] {exp.title} ...", file=sys.stderr, flush=True)
            else:
                print(f"     {entry['verdict']}: {entry['figure']} ({entry['elapsed_s']:.1f} s)", file=sys.stderr, flush=True)

        results = run_report(args.scale, only, args.device, progress)
    page = write_report(results, args.out)
    print(f"{len(results['claims'])} claims -> {page} (and results.json)")
    for c in results["claims"]:
        print(f"  {c['id']:2d}. {c['title']:45s} {c['verdict']:14s} {c['figure']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from attnlab.config import TASKS, TOKENIZERS

    parser = _Parser(prog="attnlab", description="Transformer self-attention vs its sequential rivals, measured.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train a model; --out DIR becomes its checkpoint folder")
    _model_args(p)
    g = p.add_argument_group("data and training")
    g.add_argument("--task", choices=TASKS)
    g.add_argument("--data", help="text file or folder (default: the embedded Python stdlib corpus)")
    g.add_argument("--tokenizer", choices=TOKENIZERS)
    g.add_argument("--bpe-vocab-size", type=int)
    g.add_argument("--synth-vocab", type=int, help="copy/mqar vocabulary size")
    g.add_argument("--n-pairs", type=int, help="mqar key-value pairs")
    g.add_argument("--steps", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--seq-len", type=int)
    g.add_argument("--lr", type=float)
    g.add_argument("--warmup-steps", type=int)
    g.add_argument("--grad-clip", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--device", choices=("cpu", "cuda"))
    g.add_argument("--out", required=True, help="checkpoint folder (config.json, model.safetensors, metrics.jsonl)")
    g.add_argument("--save-every", type=int)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--log-every", type=int)
    g.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    g.add_argument("--overwrite", action="store_true", help="start afresh even if --out holds a checkpoint")
    g.add_argument("--threads", type=int)
    g.add_argument("--quiet", action="store_true")
    g.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="continue a prompt with an attnlab checkpoint or a Hugging Face folder")
    p.add_argument("checkpoint", help="attnlab checkpoint folder or Hugging Face model folder (GPT-2, Llama)")
    p.add_argument("--prompt", help="text (default: read standard input)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's end-of-sequence token")
    p.add_argument("--stream", action="store_true", help="print text as tokens are chosen")
    p.add_argument("--draft", help="draft model folder for speculative decoding")
    p.add_argument("--prompt-lookup", action="store_true", help="speculative decoding with n-gram prompt lookup")
    p.add_argument("--k", type=int, default=4, help="draft tokens per speculative round")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix for every token")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "int8"),
                   help="weights: fp32, bf16, or int8 weight-only (bf16 activations)")
    p.add_argument("--cache-dtype", choices=("fp32", "bf16"), help="KV cache dtype (default: the weights')")
    p.add_argument("--truncate", choices=("left",), help="drop the prompt's first tokens if it is too long")
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("info", help="parameters, state bytes and config of a checkpoint or preset")
    p.add_argument("target", help="checkpoint folder, config.json or preset name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    from attnlab.cost.hardware import ALIASES, NAMES

    p = sub.add_parser("cost", help="predicted FLOPs, bytes, KV cache, memory and latency of a prompt")
    p.add_argument("model", nargs="?", help="preset, checkpoint folder, or config.json")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16", "int8"))
    p.add_argument("--hardware", default="h100-sxm", choices=list(NAMES) + list(ALIASES))
    p.add_argument("--memory-gb", type=float, help="memory budget for the longest-context figure")
    p.add_argument("--allow-beyond-context", action="store_true")
    p.add_argument("--compare", nargs=2, type=int, metavar=("SHORT", "LONG"), help="growth of each part")
    p.add_argument("--validate", action="store_true", help="predicted vs measured on this machine")
    p.add_argument("--refresh", action="store_true", help="re-measure the local hardware spec")
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("trace", help="measured work (FLOPs) and depth (dependent ops) of one forward")
    p.add_argument("model", nargs="?", help="preset, checkpoint folder or config.json")
    p.add_argument("--family", choices=("transformer", "rnn", "lstm", "gru"))
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--kernel", default="sdpa")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("bench", help="benchmarks: `attnlab bench attention` times every kernel")
    p.add_argument("what", choices=("attention",))
    p.add_argument("--kernels", default="naive,sdpa,flash,sliding,block_sparse,linear,ssm")
    p.add_argument("--seq-lens", default="1024,4096")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-gb", type=float, default=16.0, help="skip configurations predicted to need more")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--threads", type=int)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="run every claim's experiment; write index.html and results.json")
    p.add_argument("--scale", default="quick", choices=("quick", "full"))
    p.add_argument("--only", help="claim numbers, e.g. 1,4,10")
    p.add_argument("--out", default="runs/report")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--from", dest="from_json", help="re-render from a results.json")
    p.add_argument("--threads", type=int)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="the quick-start job: train the default model and sample from it")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def _version() -> str:
    from attnlab import __version__

    return f"attnlab {__version__}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (AttnlabError, ValueError) as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

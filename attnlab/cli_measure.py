"""The measuring subcommands: ``cost``, ``trace`` and ``bench`` (argparse + a call into the library); ``report``
lives in cli_report.py."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

from attnlab.cli_args import COMPUTE_DTYPES, add_threads
from attnlab.cli_report import add_report_command
from attnlab.errors import AttnlabError
from attnlab.runtime import DTYPES, EmulatedDtypeWarning, check_dtype, native_bf16, resolve_device, set_threads


def warn_if_emulated(command: str, dtype: str, device: str = "cpu") -> None:
    """An explicitly chosen dtype this machine only emulates still runs, with one line on stderr saying what it
    costs and what to use instead (runtime.check_dtype)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmulatedDtypeWarning)  # said below, once, as the CLI's own line
        message = check_dtype(dtype, device)
    if message:
        print(f"attnlab {command}: warning: {message}", file=sys.stderr)


def _fmt(n: float, unit: str = "") -> str:
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def cmd_cost(args) -> int:
    from attnlab.cost import Workload, compare, estimate
    from attnlab.measure.local import spec
    from attnlab.resolve import architecture

    if args.validate or args.validate_summary:
        from attnlab.cli_cost_validate import cost_validate, cost_validate_summary

        return cost_validate(args) if args.validate else cost_validate_summary(args)
    set_threads(args.threads)
    if args.model is None:
        raise AttnlabError("give a MODEL (preset, checkpoint folder or config.json), or --validate, or "
                           "--validate-summary")
    arch = architecture(args.model)
    if args.compare:
        short, long = args.compare
        res = compare(arch, short, long, args.dtype or "bf16")
        if args.json:
            print(json.dumps(res))
        else:
            print(f"{arch.name}: prefill FLOPs from {short:,} to {long:,} tokens")
            for part, v in res["parts"].items():
                print(f"  {part:22s} {_fmt(v['short_flops'], 'FLOP'):>14s} -> {_fmt(v['long_flops'], 'FLOP'):>14s}  "
                      f"x{v['factor']:,.1f}")
        return 0
    hw = spec(args.hardware, refresh=args.refresh)
    # bf16 is what GPUs serve in; on this machine it is the default only where the CPU runs it natively
    dtype = args.dtype or ("bf16" if hw.name != "local" or native_bf16("cpu") else "fp32")
    res = estimate(arch, Workload(args.prompt_tokens, args.output_tokens, args.batch, dtype), hw,
                   allow_beyond_context=args.allow_beyond_context,
                   memory_budget=args.memory_gb * 1e9 if args.memory_gb else None)
    multi = _cost_devices(arch, args, hw, dtype, res)
    if args.json:
        print(json.dumps({**res, "multi_device": multi}))
        return 0
    print(f"{arch.name} on {hw.name} ({dtype}, batch {args.batch}): {res['params']:,} parameters")
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
    _print_devices(multi, hw)
    return 0


def _cost_devices(arch, args, hw, dtype, single) -> dict:
    """``--devices N --parallel MODE``, and whenever one device cannot hold the run: the fewest devices of each kind
    that do, and the devices that prefill --prefill-tokens within --prefill-within seconds (cost.parallel)."""
    from attnlab.cost import Workload
    from attnlab.cost import hardware
    from attnlab.cost.parallel import PARALLEL, devices_to_prefill, estimate_devices, fewest_devices, layout

    intra = hardware.interconnect(args.interconnect, hw.name)
    inter = hardware.interconnect(args.inter_node, hw.name)
    w = Workload(args.prompt_tokens, args.output_tokens, args.batch, dtype)
    kw = dict(allow_beyond_context=args.allow_beyond_context)
    out = {"interconnect": intra.to_dict(), "inter_node": inter.to_dict()}
    if args.devices:
        out["requested"] = estimate_devices(arch, w, hw, intra, inter, **layout(args.devices, args.parallel), **kw)
    if args.devices or single["memory_bytes"] > hw.memory_bytes:
        out["fewest"] = {m: fewest_devices(arch, w, hw, intra, inter, m, **kw) for m in PARALLEL}
    if args.prefill_tokens:
        out["prefill"] = devices_to_prefill(arch, args.prefill_tokens, args.prefill_within, hw, intra, inter, dtype)
    return out


def _print_devices(multi: dict, hw) -> None:
    def line(r):
        mem = r["memory_per_device_bytes"]
        comm = r["comm_s"]
        return (f"{r['devices']} devices (tensor {r['tensor']} x sequence {r['sequence']} x pipeline {r['pipeline']}): "
                f"{_fmt(mem['total'], 'B')} per device (weights {_fmt(mem['weights'], 'B')}, KV {_fmt(mem['kv_cache'], 'B')}, "
                f"activations {_fmt(mem['activations'], 'B')}){'' if r['fits'] else ' -- does NOT fit'}; TTFT "
                f"{r['ttft_s'] * 1e3:,.1f} ms (all-reduce {comm['tensor_prefill'] * 1e3:,.1f} ms, ring "
                f"{comm['sequence_prefill_total'] * 1e3:,.1f} ms of which {comm['sequence_prefill_exposed'] * 1e3:,.1f} "
                f"not hidden), TPOT {r['tpot_s'] * 1e3:,.2f} ms")

    links = f"{multi['interconnect']['name']} within a node, {multi['inter_node']['name']} between nodes"
    if "requested" in multi:
        print(f"on {line(multi['requested'])} [{links}]")
    if "fewest" in multi:
        print(f"one {hw.name} ({_fmt(hw.memory_bytes, 'B')}) cannot hold it alone" if
              multi["fewest"]["tensor"] is None or multi["fewest"]["tensor"]["devices"] > 1 else
              f"fewest devices that hold it, by kind of parallelism [{links}]:")
        for mode, r in multi["fewest"].items():
            if r is None:
                why = " (the weights are replicated on every device)" if mode == "sequence" else ""
                print(f"  {mode:9s}: no count holds it{why}")
            else:
                print(f"  {mode:9s}: {line(r)}")
    if multi.get("prefill"):
        r = multi["prefill"]
        beyond = " (beyond the model's context: priced anyway)" if r["beyond_context"] else ""
        print(f"prefill of {r['prompt_tokens']:,} tokens{beyond} within {r['within_s']:g} s: {line(r)}")
    elif "prefill" in multi:
        print("prefill target: no layout up to 16k devices meets it")


def cmd_trace(args) -> int:
    import torch

    from attnlab.config import ModelConfig
    from attnlab.measure.trace import trace
    from attnlab.models import build_model
    from attnlab.resolve import model_config

    set_threads(args.threads)
    if args.seq_len <= 0:
        raise AttnlabError(f"--seq-len {args.seq_len} must be > 0")
    if args.model is None and args.family is None:
        raise AttnlabError("give a MODEL or --family F")
    if args.model is not None:
        cfg = model_config(args.model)
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


def cmd_bench_attention(args) -> int:
    from attnlab.bench import bench_attention, growth_exponent

    set_threads(args.threads)
    device = resolve_device(args.device)
    warn_if_emulated("bench", args.dtype, device)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    try:
        lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    except ValueError:
        raise AttnlabError(f"--seq-lens {args.seq_lens!r} must be comma-separated integers, e.g. 1024,4096") from None
    show = None if args.json else (lambda r: print(
        f"{r['kernel']:13s} T={r['seq_len']:>6d}  " + (f"{r['time_s'] * 1e3:10.1f} ms  {r['peak_bytes'] / 2**20:9.1f} MiB"
                                                      if r["status"] == "ok" else r["status"]), flush=True))
    rows = bench_attention(kernels, lens, args.heads, args.head_dim, args.repeats, args.budget_gb * 2**30,
                           args.dtype, args.threads, progress=show, device=device)
    if args.json:
        print(json.dumps(rows))
    else:
        for k in kernels:
            e = growth_exponent(rows, k)
            if e is not None:
                print(f"{k}: time grows as T^{e:.2f}")
    return 0


def cmd_bench_serve(args) -> int:
    import shlex

    from attnlab.serve.launch import LaunchedServer
    from attnlab.serve.loadgen import Lengths, LoadSpec, run_load

    if (args.url is None) == (args.launch is None):
        raise AttnlabError("give the server to load: --url http://HOST:PORT, or --launch FOLDER to start one")
    prompts = None
    if args.prompts:
        prompts = [line for line in Path(args.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise AttnlabError(f"--prompts {args.prompts}: the file has no non-empty line (one prompt per line)")
    spec = LoadSpec(requests=args.requests, rate=args.rate, concurrency=None if args.rate else args.concurrency or 1,
                    prompt_len=Lengths.parse(args.prompt_len, "prompt-len"),
                    output_len=Lengths.parse(args.output_len, "output-len"), prompts=prompts, vocab=args.vocab,
                    seed=args.seed, warmup=args.warmup, api_key=args.api_key, model=args.model,
                    timeout_s=args.timeout_s)
    if args.launch is None:
        res = run_load(args.url, spec)
    else:
        serve_args = shlex.split(args.serve_args or "")
        with LaunchedServer(args.launch, serve_args) as server:
            res = run_load(server.url, spec)
        res["launched"] = {"folder": args.launch, "serve_args": serve_args, "returncode": server.returncode}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    if args.json:
        print(json.dumps(res))
    else:
        print_load_table(res)
    code = res.get("launched", {}).get("returncode", 0)
    if code != 0:  # the figures stand; a server that does not drain to exit 0 is reported and fails the command
        print(f"attnlab bench: the launched server exited with {code} after SIGTERM, not 0", file=sys.stderr)
        return 1
    return 0


def print_load_table(res: dict) -> None:
    spec = res["spec"]
    print(f"{res['requests']} requests to {res['url']} ({spec['arrivals']}); prompts: {spec['prompt_len']}; "
          f"outputs: {spec['output_len']}")
    failed = ", ".join(f"{k}: {v}" for k, v in res["failed_by"].items())
    print(f"  ok {res['ok']}, failed {res['failed']}" + (f" ({failed})" if failed else ""))
    for message in res["errors"]:
        print(f"    {message}")
    print(f"  wall {res['wall_s']:.2f} s; {res['output_tokens']} output tokens, {res['output_tok_per_s']:.1f} tok/s; "
          f"{res['requests_per_s']:.2f} req/s; mean in flight {res['mean_in_flight']:.1f}")
    print(f"  {'':14s} {'p50':>10s} {'p95':>10s} {'p99':>10s} {'max':>10s}")
    rows = [("TTFT", res["ttft_s"]), ("TPOT", res["tpot_s"]), ("end-to-end", res["e2e_s"]), ("ITL", res["itl_s"]),
            ("server TTFT", res["server_usage"]["ttft_s"]), ("server TPOT", res["server_usage"]["tpot_s"])]
    for name, d in rows:
        if d["n"]:
            print(f"  {name:14s} " + " ".join(f"{d[k] * 1e3:8.1f}ms" for k in ("p50", "p95", "p99", "max")))


def add_measure_commands(sub) -> None:
    from attnlab.cost.hardware import ALIASES, NAMES

    p = sub.add_parser("cost", help="predicted FLOPs, bytes, KV cache, memory and latency of a prompt")
    p.add_argument("model", nargs="?", help="preset, checkpoint folder, or config.json")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=DTYPES,
                   help="default bf16; with --hardware local, fp32 where this CPU only emulates bf16")
    p.add_argument("--hardware", default="h100-sxm", choices=list(NAMES) + list(ALIASES))
    p.add_argument("--memory-gb", type=float, help="memory budget for the longest-context figure")
    p.add_argument("--allow-beyond-context", action="store_true")
    p.add_argument("--compare", nargs=2, type=int, metavar=("SHORT", "LONG"), help="growth of each part")
    p.add_argument("--validate", action="store_true",
                   help="predicted vs measured on this machine, on models drawn afresh from a stated space (a few "
                        "minutes; one thread unless --threads); the run is appended to --runs, met or not")
    p.add_argument("--seed", type=int, help="with --validate: draw the cases of an earlier run again (default: a fresh "
                                            "seed, recorded; a given seed's run is logged but not counted in the rule)")
    p.add_argument("--validate-summary", action="store_true",
                   help="the pass rate over every recorded validation run, and the last runs on this machine")
    p.add_argument("--runs", default="benchmarks/results/cost_validate_runs.jsonl",
                   help="the append-only log of validation runs (one JSON line each)")
    p.add_argument("--out", default="benchmarks/results/cost_validate.json",
                   help="with --validate: where the latest run's full results JSON goes")
    p.add_argument("--refresh", action="store_true", help="re-measure the local hardware spec")
    p.add_argument("--devices", type=int, help="price the run on N devices (memory per device, TTFT/TPOT with communication)")
    p.add_argument("--parallel", default="tensor", choices=("tensor", "sequence", "pipeline"),
                   help="how --devices split the work (default tensor)")
    p.add_argument("--interconnect", help="link within a node: nvlink4, nvlink3, pcie4, pcie5 (default: the hardware's)")
    p.add_argument("--inter-node", default="infiniband-ndr", help="link between nodes of 8 (default infiniband-ndr)")
    p.add_argument("--prefill-tokens", type=int, default=1_000_000,
                   help="also: the fewest devices that prefill this many tokens within --prefill-within (0: skip)")
    p.add_argument("--prefill-within", type=float, default=60.0, metavar="S", help="seconds (default 60)")
    add_threads(p)
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
    add_threads(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trace)

    bench = sub.add_parser("bench", help="benchmarks: `bench attention` times every kernel; `bench serve` loads a "
                                         "server with streaming requests")
    what = bench.add_subparsers(dest="what", required=True, parser_class=type(bench))
    p = what.add_parser("attention", help="time every attention kernel over sequence lengths")
    p.add_argument("--kernels", default="naive,sdpa,flash,sliding,block_sparse,linear,ssm")
    p.add_argument("--seq-lens", default="1024,4096")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-gb", type=float, default=16.0, help="skip configurations predicted to need more")
    p.add_argument("--dtype", default="fp32", choices=COMPUTE_DTYPES)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: times with the GPU synchronised and peak memory from torch.cuda")
    add_threads(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench_attention)

    p = what.add_parser("serve", help="streaming load on an OpenAI-compatible /v1/completions server: TTFT, TPOT, "
                                      "inter-token gaps, tok/s")
    p.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--launch", metavar="FOLDER", help="start `attnlab serve FOLDER` on a free port, load it, stop it")
    p.add_argument("--serve-args", help="extra flags for the launched server, e.g. '--max-batch 16 --threads 2'")
    arrivals = p.add_mutually_exclusive_group()
    arrivals.add_argument("--rate", type=float, help="Poisson arrivals at R requests/s (open loop)")
    arrivals.add_argument("--concurrency", type=int, help="N clients sending back to back (default: 1)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-len", default="128", help="N, LO:HI (uniform) or lognormal:MEDIAN:SIGMA[:MAX] tokens")
    p.add_argument("--output-len", default="64", help="as --prompt-len; every request generates exactly this many")
    p.add_argument("--prompts", metavar="FILE", help="text prompts, one per line, used in turn (not random ids)")
    p.add_argument("--vocab", type=int, help="random token ids are below this (default: the server's vocab_size "
                                             "from /api/info when given, else 256)")
    p.add_argument("--seed", type=int, default=0, help="seeds the prompts, the lengths and the arrival gaps")
    p.add_argument("--warmup", type=int, default=1, help="untimed requests sent first, one at a time")
    p.add_argument("--api-key")
    p.add_argument("--model", help="the request's model field (default: omitted)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.add_argument("--json", action="store_true", help="print the whole summary as JSON")
    p.add_argument("--out", help="also write the summary as JSON to this file")
    p.set_defaults(func=cmd_bench_serve)
    add_report_command(sub)

"""The ``attnlab`` command: argparse subcommands, each body a call into the library.

Invalid usage and bad input exit with code 2 and a one-line reason on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from attnlab.cli_args import add_config_flags, add_threads, add_weight_dtype, config_from_flags
from attnlab.cli_explain import add_explain_command
from attnlab.cli_generate import add_generate_command
from attnlab.cli_measure import add_measure_commands, warn_if_emulated
from attnlab.cli_recsys import add_recsys_command
from attnlab.errors import AttnlabError
from attnlab.runtime import launcher_rank, omp_wait_policy_set, set_threads
from attnlab.serve.config import ServeConfig


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
                 "grad_clip", "distill_from", "distill_weight", "distill_temperature"):
        val = getattr(args, name)
        if val is not None:
            fields[name] = val
    return TrainConfig(**fields)


def _parallel_config(args):
    from attnlab.distributed.parallel import ParallelConfig

    return ParallelConfig(nproc=args.nproc, shard=args.shard, seq_parallel=args.seq_parallel,
                          timeout_s=args.dist_timeout)


def cmd_train(args) -> int:
    from attnlab.distributed.group import launched
    from attnlab.train import train

    parallel = _parallel_config(args)
    if not launched() and (parallel.nproc > 1 or parallel.seq_parallel > 1 or parallel.shard):
        if parallel.nproc == 1:
            raise AttnlabError("--shard and --seq-parallel need several processes: add --nproc N (or run under "
                               "torchrun --nproc-per-node N -m attnlab train ...)")
        from attnlab.distributed.launch import launch

        return launch(args.argv, parallel.nproc, threads=args.threads)
    set_threads(args.threads)
    rank = launcher_rank()
    try:
        summary = train(_model_config(args), _train_config(args), args.out, resume=args.resume,
                        overwrite=args.overwrite, progress=not args.quiet and rank == 0, parallel=parallel)
    except RuntimeError as e:  # a peer that died or hung surfaces here as a backend error
        if not launched():
            raise
        raise AttnlabError(f"rank {rank}: {type(e).__name__}: {str(e).strip().splitlines()[0]}") from None
    if rank != 0:
        return 0
    if summary.get("stale_lock_pid"):
        print(f"attnlab train: note: {args.out} was last locked by pid {summary['stale_lock_pid']}, a run that was "
              "killed; its lock was taken over", file=sys.stderr)
    print(json.dumps(summary) if args.json else
          f"trained {summary['params']:,} params to step {summary['final_step']} in {summary['train_s']:.1f} s: "
          f"loss {summary.get('loss', float('nan')):.4f}, held-out loss {summary.get('val_loss', float('nan')):.4f}; "
          f"checkpoint in {args.out}")
    return 0


def cmd_serve(args) -> int:
    import os

    if not omp_wait_policy_set() and args.from_command_line:
        # The engine thread's OpenMP team spins between ops by default, taking the core the HTTP thread needs to
        # stream tokens (docs/serving.md has the measured steps). libgomp reads the policy once, when torch loads
        # it, so the server starts again in a process that has it (the user's own setting, if any, is kept).
        os.execve(sys.executable, [sys.executable, "-m", "attnlab", *sys.argv[1:]],
                  {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    from attnlab.serve.server import serve

    set_threads(args.threads)
    warn_if_emulated("serve", args.dtype)
    args.prefill_chunk = args.prefill_chunk or None  # 0 on the command line: whole prompts
    cfg = config_from_flags(ServeConfig, args, api_key=_api_key(args), allow_origins=tuple(args.allow_origin))
    return serve(args.checkpoint, cfg, args.dtype, args.log_level)


def _api_key(args) -> str | None:
    """The server's API key: --api-key-file, else ATTNLAB_API_KEY, else --api-key (visible to anyone running
    ``ps``, so the other two are preferred)."""
    from attnlab.runtime import env_api_key

    given = [n for n, v in (("--api-key-file", args.api_key_file), ("--api-key", args.api_key)) if v]
    if len(given) > 1:
        raise AttnlabError("give --api-key-file or --api-key, not both")
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as e:
            raise AttnlabError(f"--api-key-file {args.api_key_file}: cannot read it ({e.strerror})") from None
        if not key:
            raise AttnlabError(f"--api-key-file {args.api_key_file} is empty; write the key on its first line")
        return key
    return args.api_key or env_api_key()


def describe(cfg) -> dict:
    """Parameter count and state size for a config, built on the meta device (no memory)."""
    import torch

    from attnlab.models import build_model, count_params

    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    built = model.new_state(1, dtype=torch.float32, device="meta")  # the state's own accounting: nothing allocated
    per_token = built.bytes_per_token
    state = {"state_bytes_per_token": per_token, "state_bytes_fixed": 0 if per_token else built.nbytes}
    return {"params": count_params(model), **state, "dtype": "fp32", "config": cfg.to_dict()}


def cmd_info(args) -> int:
    from attnlab.resolve import model_config

    cfg = model_config(args.target)
    info = describe(cfg)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{args.target}: {cfg.family}, {info['params']:,} parameters")
    if info["state_bytes_fixed"]:
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
    from attnlab.resolve import load_model
    from attnlab.train import train

    set_threads(args.threads)
    t0 = time.perf_counter()
    tcfg = TrainConfig(steps=args.steps, batch_size=16, seq_len=128, eval_every=max(1, args.steps // 4),
                       save_every=args.steps, seed=args.seed)
    print(f"attnlab demo: training the default transformer on the embedded corpus (Python's stdlib sources), "
          f"{args.steps} steps", flush=True)
    summary = train(preset("default"), tcfg, args.out, overwrite=True, progress=not args.quiet)
    loaded = load_model(args.out)
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
    g.add_argument("--distill-from", metavar="TEACHER",
                   help="checkpoint or Hugging Face folder to imitate (KL to its next-token distributions), e.g. "
                        "to make a speculative-decoding draft for it; needs the same tokenizer")
    g.add_argument("--distill-weight", type=float, help="w in (1-w)*cross-entropy + w*KL (default 1)")
    g.add_argument("--distill-temperature", type=float,
                   help="teacher temperature (default 1; below 1 sharpens it towards its argmax)")
    g.add_argument("--seed", type=int)
    g.add_argument("--device", choices=("cpu", "cuda"))
    g.add_argument("--out", required=True, help="checkpoint folder (config.json, model.safetensors, metrics.jsonl)")
    g.add_argument("--save-every", type=int)
    g.add_argument("--eval-every", type=int)
    g.add_argument("--log-every", type=int)
    g.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint in --out with a new run (without it, or --resume, a folder that "
                        "holds a checkpoint is refused)")
    add_threads(g)
    g.add_argument("--quiet", action="store_true")
    g.add_argument("--json", action="store_true")
    g = p.add_argument_group("several processes (torch.distributed: gloo on CPU, NCCL on GPU)")
    g.add_argument("--nproc", type=int, default=1,
                   help="local processes; --batch-size stays the global batch, split across them (the same as "
                        "torchrun --nproc-per-node N -m attnlab train ...)")
    g.add_argument("--shard", action="store_true",
                   help="FSDP2: shard parameters, gradients and optimizer state across the processes (default: DDP)")
    g.add_argument("--seq-parallel", type=int, default=1, metavar="N",
                   help="split every sequence across N processes (ring attention; transformer only)")
    g.add_argument("--dist-timeout", type=float, default=300.0, metavar="S",
                   help="seconds any collective may wait: a rank that dies or hangs stops the run within this")
    p.set_defaults(func=cmd_train)

    add_generate_command(sub)
    add_explain_command(sub)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (continuous batching, prefix cache, live page)")
    p.add_argument("checkpoint", help="attnlab checkpoint folder or Hugging Face model folder")
    add_config_flags(p, ServeConfig)
    p.add_argument("--api-key-file", help="require 'Authorization: Bearer KEY' on /v1 and /api, KEY read from this "
                   "file (or set ATTNLAB_API_KEY)")
    p.add_argument("--api-key", help="the key on the command line (visible in `ps`: prefer --api-key-file)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (e.g. http://localhost:3000) allowed to call the API from a browser, besides "
                        "the server's own page; repeatable")
    add_weight_dtype(p)
    add_threads(p)
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("info", help="parameters, state bytes and config of a checkpoint or preset")
    p.add_argument("target", help="checkpoint folder, config.json or preset name")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    add_measure_commands(sub)
    add_recsys_command(sub)

    p = sub.add_parser("demo", help="the quick-start job: train the default model and sample from it")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/demo")
    add_threads(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_demo)
    return parser


def _version() -> str:
    from attnlab import __version__

    return f"attnlab {__version__}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.from_command_line = argv is None  # a process of its own (serve may restart itself with other settings)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what --nproc hands each rank
    try:
        return args.func(args)
    except (AttnlabError, ValueError) as e:
        print(f"attnlab {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

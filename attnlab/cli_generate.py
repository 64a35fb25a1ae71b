"""``attnlab generate``: continue a prompt with a checkpoint or a Hugging Face folder, plainly, streamed, or by
speculative decoding (a draft model or prompt lookup)."""
from __future__ import annotations

import json
import sys

from attnlab.cli_args import add_threads, add_weight_dtype
from attnlab.cli_measure import warn_if_emulated
from attnlab.errors import AttnlabError
from attnlab.runtime import set_threads


def read_prompt(args) -> str:
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
    from attnlab.resolve import load_model

    set_threads(args.threads)
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed)
    if args.draft and args.prompt_lookup:
        raise AttnlabError("choose one proposer: --draft DRAFT or --prompt-lookup, not both")
    if (args.draft or args.prompt_lookup) and (args.no_cache or args.stream):
        raise AttnlabError("speculative decoding needs the KV cache and returns whole rounds: drop --no-cache/--stream")
    prompt = read_prompt(args)
    target = load_model(args.checkpoint)
    if target.tokenizer is None:
        raise AttnlabError(f"{args.checkpoint} has no tokenizer.json, so text cannot be encoded; add one")
    speculative = bool(args.draft or args.prompt_lookup)
    if speculative and args.k < 1:
        raise AttnlabError(f"--k {args.k}: a speculative round needs at least 1 draft token")
    warn_if_emulated("generate", args.dtype)
    # a speculative target mostly runs (k+1)-row verify passes: lay its weights out for that size
    model = set_precision(target.model, args.dtype, rows=args.k + 1 if speculative else 1)
    ids = target.tokenizer.encode(prompt)
    stop_tokens = target.stop_tokens if not args.ignore_eos else []
    common = dict(stop_tokens=stop_tokens, stop_strings=args.stop or (), tokenizer=target.tokenizer,
                  truncate=args.truncate)
    if speculative:
        draft = set_precision(load_model(args.draft).model, args.dtype) if args.draft else None
        out = speculative_generate(model, ids, args.max_new_tokens, k=args.k, draft=draft,
                                   prompt_lookup=args.prompt_lookup, params=params,
                                   lookup_ngram=(args.lookup_min_ngram, args.lookup_max_ngram), **common)
    elif args.stream:
        from attnlab.engine.engine import Engine, EngineConfig, output_of

        engine = Engine(model, EngineConfig(cache_dtype=_cache_dtype(args.cache_dtype)), target.tokenizer)
        for event in engine.stream(ids, args.max_new_tokens, params, stop_tokens, args.stop or (), args.truncate):
            if not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        out = output_of(event)
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


def add_generate_command(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt with an attnlab checkpoint or a Hugging Face folder")
    p.add_argument("checkpoint", help="attnlab checkpoint folder or Hugging Face model folder "
                   "(GPT-2, Llama, Mistral, Qwen2)")
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
    p.add_argument("--lookup-min-ngram", type=int, default=2,
                   help="prompt lookup proposes only after matching at least this many trailing tokens")
    p.add_argument("--lookup-max-ngram", type=int, default=4, help="longest trailing n-gram prompt lookup matches")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole prefix for every token")
    add_weight_dtype(p)
    p.add_argument("--cache-dtype", choices=("fp32", "bf16"), help="KV cache dtype (default: the weights')")
    p.add_argument("--truncate", choices=("left",), help="drop the prompt's first tokens if it is too long")
    add_threads(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

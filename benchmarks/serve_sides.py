"""The sides serve_load.py compares with the server, each driven directly in a process of its own: the engine (as
the server builds it) and the peers (Hugging Face's two batched paths, CTranslate2). The parent starts a side with
SideProcess, sends prompts as JSON lines on its stdin and reads each measurement back from its stdout.

    python benchmarks/serve_sides.py SIDE FOLDER [--threads 2] [--prefill-chunk 256] [--max-batch 64] [--kv-blocks 1024]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import JsonLinesProcess, set_threads  # noqa: E402


def in_engine(engine, ps: list[list[int]], out: int) -> dict:
    """The server's engine without HTTP: add every request at once, step until done (as the worker does)."""
    from attnlab.engine.request import Request

    t0 = time.perf_counter()
    ids = [engine.add(Request(p, out)) for p in ps]
    results = {}
    while engine.has_work:
        results.update({e.id: e.result for e in engine.step() if e.done})
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results.values())
    return {"tok_per_s": tokens / wall, "wall_s": wall, "output_tokens": tokens,
            "cached_tokens": sum(r.cached_tokens for r in results.values()),
            "outputs": [list(results[i].tokens) for i in ids]}


def in_thread(fn, *args):
    """Run fn in a fresh thread, as the server runs its engine: on a loaded machine torch ops issued from the
    main thread ran up to 30x slower here (OpenMP's spin-waiting team), so every in-process side runs like the
    server's engine thread does."""
    out: list = []

    def target() -> None:
        try:
            out.append(fn(*args))
        except Exception as e:  # re-raised in the caller
            out.append(e)

    t = threading.Thread(target=target, name="bench-side")
    t.start()
    t.join()
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


def through_hf(hf_fn, folder: str, ps: list[list[int]], out: int) -> dict:
    t0 = time.perf_counter()
    res = hf_fn(folder, ps, out)
    outer = time.perf_counter() - t0
    return {"tok_per_s": res["output_tokens"] / res["wall_s"], "wall_s": res["wall_s"], "call_wall_s": outer,
            "output_tokens": res["output_tokens"],
            **{k: v for k, v in res.items() if k not in ("wall_s", "output_tokens", "tok_per_s")}}


def through_ct2(generate, ps: list[list[int]], out: int) -> dict:
    t0 = time.perf_counter()
    outputs = generate(ps, out)
    wall = time.perf_counter() - t0
    tokens = sum(map(len, outputs))
    return {"tok_per_s": tokens / wall, "wall_s": wall, "output_tokens": tokens, "outputs": outputs}


PEERS = ("hf_generate_batch", "hf_generate", "ctranslate2")


def peer_missing(side: str) -> str | None:
    """Why a peer cannot run here (its library is not installed), or None."""
    import importlib.util

    library = "ctranslate2" if side == "ctranslate2" else "transformers"
    return None if importlib.util.find_spec(library) else \
        f"skipped: {library} is not installed (pip install -e '.[bench]')"


class SideProcess(JsonLinesProcess):
    """The engine (or a peer) driven directly, in a process of its own, like the server: a side run inside the
    parent shares its cores with the load generator and the other in-process side, and the server's next run was
    slower for it (docs/measuring.md), so each side gets a warm process that takes prompts on stdin and answers
    its measurement on stdout."""

    def __init__(self, side: str, folder: str, threads: int, prefill_chunk: int, max_batch: int, kv_blocks: int):
        super().__init__([sys.executable, __file__, side, folder, "--threads", str(threads), "--prefill-chunk",
                          str(prefill_chunk), "--max-batch", str(max_batch), "--kv-blocks", str(kv_blocks)],
                         f"the {side} side")

    def __call__(self, ps: list[list[int]], out: int) -> dict:
        return self.request({"prompts": ps, "out": out})


def side_main(args) -> None:
    """Child: serve measurements of one side until stdin closes (results as JSON lines on stdout)."""
    if args.side == "engine":
        from attnlab.engine.engine import Engine
        from attnlab.serve.config import ServeConfig
        from attnlab.serve.server import load_served

        served = load_served(args.folder, max_batch=args.max_batch)  # the server's loading path: same layout
        cfg = ServeConfig(max_batch=args.max_batch, kv_blocks=args.kv_blocks, prefill_chunk=args.prefill_chunk or None,
                          calibrate=False)
        engine = Engine(served.model, cfg.engine_config(served.model.cache_dtype),
                        served.tokenizer)  # the server's engine, its text included
        run = lambda ps, out: in_thread(in_engine, engine, ps, out)  # noqa: E731 (as the server's thread)
    elif args.side == "ctranslate2":
        import shutil

        from vs_ctranslate2 import convert_for_ct2, ct2_side, save_word_tokenizer

        with tempfile.TemporaryDirectory() as copy:  # the served folder is left as it is
            folder = shutil.copytree(args.folder, Path(copy) / "model")
            save_word_tokenizer(str(folder), json.loads((folder / "config.json").read_text())["vocab_size"])
            generate = ct2_side(convert_for_ct2(str(folder)), "fp32", args.threads)
        run = lambda ps, out: in_thread(through_ct2, generate, ps, out)  # noqa: E731
    else:
        import hf_continuous

        hf_fn = hf_continuous.run_hf_generate_batch if args.side == "hf_generate_batch" else \
            hf_continuous.run_hf_generate
        run = lambda ps, out: in_thread(through_hf, hf_fn, args.folder, ps, out)  # noqa: E731
    for line in sys.stdin:
        req = json.loads(line)
        try:
            res = run(req["prompts"], req["out"])
        except Exception as e:  # reported to the parent, which records it
            res = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(res), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("side", choices=("engine", *PEERS))
    p.add_argument("folder", help="the Hugging Face folder the server serves")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill-chunk", type=int, default=256, help="the engine's (0: whole prompts)")
    p.add_argument("--max-batch", type=int, default=64, help="the engine's, as the server's")
    p.add_argument("--kv-blocks", type=int, default=1024, help="the engine's, as the server's")
    args = p.parse_args()
    set_threads(args.threads)
    side_main(args)


if __name__ == "__main__":
    main()

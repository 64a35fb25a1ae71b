"""The engine at two commits, side by side: did a change meant to leave behaviour alone (a refactor) move its speed?

    python benchmarks/engine_at_two_commits.py BEFORE [AFTER] [--rounds 5] [--threads 2]

Each commit is checked out into a temporary git worktree, and every measurement runs in a fresh process with that
tree first on the import path, so the two sides run their own code on one machine, one clock. The rounds alternate
the order (ABBA: common.round_order), every process warms each path before timing it, and every ratio is after /
before of one round; the verdict is on the median ratio against the rounds' own spread (MEASURING.md).

Measured, on a GPT-2-small-shaped model with random weights (seed 0) as ``set_precision`` lays it out for one row:
the TTFT of a 512-token prompt and the decode time per token after it (batch 1), in fp32 and (where the CPU runs
it natively) bf16; and 8 sequences of 128 prompt tokens generating 32 each, output tokens per second. Writes
benchmarks/results/engine_at_two_commits.json with the machine context and both commits.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import context, round_order, set_threads, write_json

REPO = Path(__file__).resolve().parents[1]

# Run in the child with the tree under test first on sys.path; only APIs both sides share (generate, set_precision,
# build_model, preset), so it times either side's engine as a user of that commit would call it.
CHILD = r"""
import json, statistics, sys, time
import torch
from attnlab.config import preset
from attnlab.engine import generate
from attnlab.engine.quantize import set_precision
from attnlab.models import build_model
from attnlab.runtime import set_threads

dtype, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
set_threads(threads)
torch.manual_seed(0)
model = set_precision(build_model(preset("gpt2")).eval(), dtype)
g = torch.Generator().manual_seed(1)
prompt = torch.randint(0, 50257, (512,), generator=g).tolist()
batch = [torch.randint(0, 50257, (128,), generator=g).tolist() for _ in range(8)]
with torch.inference_mode():
    generate(model, prompt, 4)  # warm every path once
    generate(model, batch, 4)
    ttft, tpot, tok_s = [], [], []
    for _ in range(repeats):
        out = generate(model, prompt, 17)
        ttft.append(out.stats.ttft_s)
        tpot.append(out.stats.tpot_s)
        t = time.perf_counter()
        out = generate(model, batch, 32)
        tok_s.append(sum(len(c.tokens) for c in out.completions) / (time.perf_counter() - t))
print(json.dumps({"ttft_ms": 1e3 * statistics.median(ttft), "decode_ms": 1e3 * statistics.median(tpot),
                  "batch8_tok_per_s": statistics.median(tok_s),
                  "torch": torch.__version__, "attnlab": sys.modules["attnlab"].__file__}))
"""
FIGURES = ("ttft_ms", "decode_ms", "batch8_tok_per_s")
HIGHER_IS_BETTER = {"batch8_tok_per_s"}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def _measure(tree: Path, dtype: str, threads: int, repeats: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, dtype, str(threads), str(repeats)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree))
    if proc.returncode != 0:
        raise SystemExit(f"the child at {tree} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["attnlab"].startswith(str(tree)):  # the tree under test, not the installed checkout
        raise SystemExit(f"the child imported attnlab from {out['attnlab']}, not {tree}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", help="the commit before the change")
    p.add_argument("after", nargs="?", default="HEAD", help="the commit after it (default HEAD)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per process (their median)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "engine_at_two_commits.json"))
    args = p.parse_args()
    threads = set_threads(args.threads)
    from attnlab.runtime import fast_dtypes

    dtypes = [d for d in args.dtypes.split(",") if d in fast_dtypes("cpu")]
    commits = {"before": _git("rev-parse", args.before), "after": _git("rev-parse", args.after)}
    with tempfile.TemporaryDirectory(prefix="two_commits_") as tmp:
        trees = {}
        for side, commit in commits.items():
            trees[side] = Path(tmp) / side
            _git("worktree", "add", "--detach", "-q", str(trees[side]), commit)
        try:
            rounds = {d: [] for d in dtypes}
            for r in range(args.rounds):
                for d in dtypes:
                    got = {side: _measure(trees[side], d, threads, args.repeats)
                           for side in round_order(["before", "after"], r)}
                    rounds[d].append(got)
                    print(f"round {r + 1} {d}: " + "; ".join(
                        f"{f} {got['before'][f]:.2f} -> {got['after'][f]:.2f}" for f in FIGURES), flush=True)
        finally:
            for tree in trees.values():
                _git("worktree", "remove", "--force", str(tree))
    rows = {}
    for d, rs in rounds.items():
        for f in FIGURES:
            ratios = [x["after"][f] / x["before"][f] for x in rs]
            better = [r if f in HIGHER_IS_BETTER else 1 / r for r in ratios]  # > 1: the after side is faster
            med = statistics.median(better)
            rows[f"{f}_{d}"] = {"before": statistics.median(x["before"][f] for x in rs),
                                "after": statistics.median(x["after"][f] for x in rs),
                                "after_speed_over_before": med, "range": [min(better), max(better)],
                                "within_noise": min(better) <= 1.0 <= max(better) or abs(med - 1) <= 0.03}
    out = {"benchmark": "engine_at_two_commits", "context": context(dtype="fp32"), "commits": commits,
           "rounds": args.rounds, "repeats": args.repeats, "threads": threads, "dtypes": dtypes,
           "model": "GPT-2 small shape, random weights (seed 0)", "rows": rows, "raw": rounds}
    for k, v in rows.items():
        print(f"{k:28s} before {v['before']:9.2f}  after {v['after']:9.2f}  after speed / before "
              f"{v['after_speed_over_before']:.3f} (range {v['range'][0]:.3f}-{v['range'][1]:.3f})"
              + ("" if v["within_noise"] else "  <- beyond the rounds' spread"))
    print(f"wrote {write_json(args.out, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

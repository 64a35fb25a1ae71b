"""``attnlab report``: run the claims' experiments, write results.json and a self-contained index.html."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import AttnlabError

TEMPLATE = Path(__file__).with_name("template.html")  # package data: pyproject.toml ships it in the wheel


def run_report(scale: str = "quick", only: list[int] | None = None, device: str = "cpu", progress=None) -> dict:
    """Run the chosen claims' experiments on ``device``; each claim's entry records the device it ran on."""
    from attnlab.experiments import registry
    from attnlab.experiments.base import label
    from attnlab.kernels import paths
    from attnlab.runtime import machine_context, resolve_device, set_threads
    from attnlab.timing import host_speed

    exps = registry()
    if only:
        missing = [i for i in only if i not in exps]
        if missing:
            raise AttnlabError(f"--only {missing}: no such claim; claims are {', '.join(map(str, sorted(exps)))}")
    chosen = [exps[i] for i in sorted(exps) if not only or i in only]
    device = str(resolve_device(device))
    set_threads()  # keeps the thread count, flushes denormals
    speed = {"start": host_speed()}  # the wall time below depends on the host's speed as much as on the code
    t0 = time.perf_counter()
    stage = training_stage(chosen, scale, device, progress)
    claims = []
    for exp in chosen:
        if progress:
            progress(exp, None)
        t, before = time.perf_counter(), paths.snapshot()
        outcome = exp.run(scale, device)
        entry = {"id": exp.id, "slug": exp.slug, "title": exp.title, "claim": exp.claim, "prediction": exp.prediction,
                 "threshold": exp.threshold, "regime_statement": exp.regime, "changes": exp.changes,
                 "source": exp.source,
                 "elapsed_s": time.perf_counter() - t,
                 "kernel_paths": paths.since(before),  # which compiled paths and fallbacks this claim's code took
                 **outcome.to_dict()}
        entry["device"] = outcome.device or device  # an experiment that ran elsewhere (e.g. "meta") says so
        entry["label"] = label(outcome.verdict, outcome.qualifier)
        claims.append(entry)
        if progress:
            progress(exp, entry)
    total_s = time.perf_counter() - t0
    speed["end"] = host_speed()
    context = {**machine_context(0, device=device), "host_speed": speed}
    return {"attnlab_report": 1, "scale": scale, "device": device, "seed": 0, "context": context,
            "reference": reference_status(context), "total_s": total_s, "training": stage, "claims": claims}


@dataclass(frozen=True)
class Stage:
    """The training stage as the progress display sees it: a step before claim 1 (id 0)."""
    id: int = 0
    title: str = "Training the models the claims compare"


def training_stage(chosen, scale: str, device: str, progress=None) -> dict:
    """Train every model the chosen claims need before the first one runs (experiments/training.py), so the claims
    that time something run on a quiet machine: {"s", "tasks", "workers", "jobs"} (each job's record:
    training.job_record). Each claim's elapsed_s leaves this out."""
    from attnlab.experiments import training

    hooks = [e.training for e in chosen if e.training]
    if not hooks:
        return {"s": 0.0, "tasks": 0, "workers": 0, "jobs": []}
    if progress:
        progress(Stage(), None)
    t = time.perf_counter()
    workers, jobs = training.workers_for(device), []
    n = training.prepare(hooks, scale, device, workers, jobs)
    out = {"s": time.perf_counter() - t, "tasks": n, "workers": workers, "jobs": jobs}
    if progress:
        progress(Stage(), {"elapsed_s": out["s"], "verdict": "trained",
                           "figure": f"{n} training tasks, {workers} at a time"})
    return out


def reference_status(context: dict) -> dict:
    """Whether these results can serve as a reference: only a run from a clean tree at a named commit can, since
    a dirty tree's code cannot be checked out again to reproduce it."""
    git = context.get("git") or {}
    if not git.get("commit"):
        return {"usable": False, "why": "not run from a git checkout: no commit names the code that ran"}
    if git.get("dirty") is not False:
        return {"usable": False, "why": f"run from a tree with uncommitted changes at {git['commit'][:12]}: "
                                        "the code that ran is not any commit; rerun from a clean tree"}
    return {"usable": True, "why": f"clean tree at {git['commit'][:12]}"}


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return v


# The view of `attnlab explain` that shows each claim's mechanism on the reader's own model (its tab's anchor, and
# what to look at there).
EXPLAIN_VIEWS = {
    "work_depth": ("recurrence", "one dependent step per token and layer, against attention's one pass"),
    "parallel_idle": ("recurrence", "the chain a recurrent model cannot start before the previous step ends"),
    "path_length": ("recurrence", "how far back a token's influence still reaches through the chain"),
    "permutation": ("order", "the shuffled prompt's weights without positions: the permuted original"),
    "extrapolation": ("order", "RoPE's score as a function of distance"),
    "quadratic": ("grid", "n(n+1)/2 score cells per head beside the measured prefill time"),
    "ffn_share": ("grid", "the prefill time as n grows, against the score cells"),
    "remedies": ("attention", "a sliding or sparse checkpoint's mask in the heatmap"),
    "prefill_decode": ("decode", "the grid filled at once, then one row per token, with each step's time"),
    "kv_cache": ("decode", "the cached keys each new row reads, the cache growing block by block"),
    "input_cheaper": ("decode", "a prompt's rows in one step against one row per output token"),
    "long_chats": ("grid", "the prefill time of a longer context"),
    "speculative": ("decode", "one decode step's time: what a verify pass of k+1 rows competes with"),
    "attention_budget": ("budget", "the last row's entropy and its weight on the prompt as text is added"),
    "position": ("attention", "where each token's weight goes, row by row"),
    "send_relevant": ("budget", "the weight irrelevant text takes from the prompt"),
    "split_devices": ("recurrence", "the chain a nonlinear recurrence runs, step after step"),
    "recsys": ("attention", "what each position of a sequence reads"),
}


def render(results: dict) -> str:
    import jinja2

    from attnlab.experiments.base import label
    from attnlab.report.plots import svg

    env = jinja2.Environment(autoescape=True)
    env.filters["fmt"] = _fmt
    claims = []
    for c in results["claims"]:
        columns = list(dict.fromkeys(k for row in c.get("table", []) for k in row))  # rows may differ: the union
        claims.append({**c, "svgs": [svg(p) for p in c.get("plots", [])], "columns": columns,
                       "label": c.get("label") or label(c["verdict"], c.get("qualifier", "")),
                       "explain": EXPLAIN_VIEWS.get(c.get("slug"))})
    ref = results.get("reference") or reference_status(results["context"])
    return env.from_string(TEMPLATE.read_text()).render(claims=claims, ctx=results["context"], scale=results["scale"],
                                                        total_s=results.get("total_s", 0.0), reference=ref,
                                                        training=results.get("training") or {})


def write_report(results: dict, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    page = out / "index.html"
    page.write_text(render(results))
    return page


def load_results(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise AttnlabError(f"{path}: no such results file; run `attnlab report` first") from None
    except json.JSONDecodeError as e:
        raise AttnlabError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or "claims" not in data or "context" not in data:
        raise AttnlabError(f"{path}: not an attnlab results.json (no 'claims' list)")
    return data

"""Every run of ``attnlab cost --validate``, met or not, as one JSON line in an append-only log, and the figures to
quote from it: the pass rate over all recorded runs, and whether the goal held in RULE_NEED of the last RULE_OF runs
on a machine.

Why a log: a validation rerun until it passes says nothing; the rate over every run does (MEASURING.md, "Every run
counts"). Lines are only ever appended, never rewritten. A run counts towards the RULE_NEED-of-RULE_OF rule only when
its seed was fresh (not given with ``--seed``, which repeats an earlier draw) and its code was committed (a clean
tree, leaving out the results folder that earlier runs write into): then every such run enters the window, in order,
and none can be chosen. The pass rate counts every line.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict
from pathlib import Path

RUNS_PATH = "benchmarks/results/cost_validate_runs.jsonl"
RESULTS_DIR = "benchmarks/results"  # written by the runs themselves: not a change to the code (runtime.code_version)
RULE_NEED, RULE_OF = 4, 5  # the goal must hold in 4 of the last 5 counted runs on a machine (issue 29)


def machine_key(context: dict) -> str:
    """One machine in the log's vocabulary: the CPU model, torch's CPU capability, an ISA limit if one was set, and
    the threads (one thread is timed on CPU time, more on wall time: not comparable)."""
    limits = ", ".join(f"{k}={v}" for k, v in sorted((context.get("isa_limits") or {}).items()))
    threads = context.get("threads")
    return (f"{context.get('cpu') or 'unknown CPU'} ({context.get('cpu_capability')}"
            f"{', ' + limits if limits else ''}; {threads} thread{'' if threads == 1 else 's'})")


def record(res: dict | None, *, seed: int, seed_given: bool, duration_s: float, context: dict, git: dict | None,
           cases=None, error: str | None = None) -> dict:
    """The log line of one run: each case with its predicted, measured and error by phase, the median and worst
    |error|, the goal and whether it was met. ``res`` is validate()'s result, or None for a run that failed before
    its end (``error`` says why: the run counts as not met)."""
    from attnlab.measure.validate import GOAL

    line = {"date": context.get("date"), "git": git, "machine": machine_key(context),
            "context": {k: v for k, v in context.items() if k != "git"}, "seed": seed, "seed_given": seed_given,
            "duration_s": round(duration_s, 1), "goal": GOAL}
    if res is None:
        return {**line, "cases": [asdict(c) for c in cases or ()], "median": None, "worst": None, "met": False,
                "error": error}
    by_case: dict = {}
    for r in res["rows"]:
        by_case.setdefault(r["case"], {})[r["phase"]] = {k: r[k] for k in ("predicted_s", "measured_s", "error")}
    names = {c["name"]: c for c in res["cases"]}
    s = res["summary"].get("all")
    return {**line, "space": res["space"], "clock": res["clock"], "threads": res["threads"],
            "repeats": res["repeats"], "new_tokens": res["new_tokens"],
            "cases": [{**names[n], **phases} for n, phases in by_case.items()], "skipped": res["skipped"],
            "median": s and s["median"], "worst": s and s["worst"], "met": bool(res["summary"].get("met")),
            "error": None}


def append(path: str | Path, line: dict) -> None:
    """Add one line at the end of the log, in one write to a file opened for appending, so earlier lines are never
    rewritten (and two runs at once do not interleave). A log whose last line lacks its newline gets one first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(line, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size and not _ends_with_newline(path):
            text = "\n" + text
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def load(path: str | Path) -> list[dict]:
    """The runs in the log, oldest first; none if it does not exist. A line that is not JSON is an error naming it
    (it is never skipped: every run counts)."""
    path = Path(path)
    if not path.exists():
        return []
    return parse(path.read_text(encoding="utf-8"), str(path))


def parse(text: str, where: str = "the log") -> list[dict]:
    runs = []
    for i, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            try:
                runs.append(json.loads(raw))
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}, line {i}: not a JSON run record ({e.msg}); fix or remove that line "
                                 "by hand and say so in the commit") from None
    return runs


def counted(run: dict) -> bool:
    """Whether a run enters the RULE_NEED-of-RULE_OF window: a fresh seed and a clean tree (see the docstring)."""
    return not run.get("seed_given") and (run.get("git") or {}).get("dirty") is False


def summarize_runs(runs: list[dict]) -> dict:
    """Pass rate over all runs and by machine; per machine, the last RULE_OF counted runs and whether the goal held
    in RULE_NEED of them ("rule_met" None while fewer than RULE_OF have been counted)."""
    def rate(rs):
        met = sum(bool(r.get("met")) for r in rs)
        return {"runs": len(rs), "met": met, "pass_rate": met / len(rs) if rs else None}

    machines = {}
    for key in dict.fromkeys(r.get("machine") for r in runs):
        mine = [r for r in runs if r.get("machine") == key]
        window = [r for r in mine if counted(r)][-RULE_OF:]
        n_met = sum(bool(r.get("met")) for r in window)
        machines[key] = {**rate(mine), "window": [
            {k: r.get(k) for k in ("date", "seed", "median", "worst", "met", "duration_s", "error")}
            | {"commit": (r.get("git") or {}).get("commit")} for r in window],
            "window_met": n_met, "rule_met": (n_met >= RULE_NEED) if len(window) == RULE_OF else None,
            "median_duration_s": statistics.median(r["duration_s"] for r in mine) if mine else None}
    return {**rate(runs), "rule": {"need": RULE_NEED, "of": RULE_OF}, "machines": machines}


def readme_line(summary: dict) -> str:
    """The sentence the README quotes: the pass rate over all recorded runs, and each machine's last-runs rule."""
    n, k = summary["runs"], summary["met"]
    if not n:
        return "Recorded runs: none yet."
    parts = []
    for key, m in summary["machines"].items():
        w = len(m["window"])
        verdict = ("met" if m["rule_met"] else "not met") if m["rule_met"] is not None else \
            f"not yet decided ({w} of {RULE_OF} counted runs)"
        parts.append(f"{key}: {m['met']} of {m['runs']}; goal in {RULE_NEED} of the last {RULE_OF}: {verdict}")
    return f"Recorded runs: {k} of {n} met the goal ({k / n:.0%}). " + "; ".join(parts) + "."

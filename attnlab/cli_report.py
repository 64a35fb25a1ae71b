"""The ``report`` subcommand: run the claims' experiments with a progress bar and an ETA, then write the page."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.cli_args import add_threads
from attnlab.errors import AttnlabError
from attnlab.runtime import resolve_device, set_threads


DEFAULT_EST_S = 60.0  # an experiment that declares no EST_S and has no earlier run to go by


def _estimates(scale: str, only, previous: Path) -> dict[int, float]:
    """Seconds each chosen claim is expected to take (and the training stage, as step 0, when a chosen claim trains
    models): its time in the last report written to the same folder at the same scale, else the module's EST_S
    (TRAIN_EST_S summed over the chosen claims, for the stage) for the scale."""
    from attnlab.experiments import registry

    before, stage_before = {}, None
    try:
        old = json.loads(previous.read_text())
        if old.get("scale") == scale:
            before = {c["id"]: c["elapsed_s"] for c in old["claims"] if c.get("elapsed_s")}
            stage_before = (old.get("training") or {}).get("s")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    chosen = {i: e for i, e in sorted(registry().items()) if not only or i in only}
    stage = sum(e.train_est_s.get(scale, 0) for e in chosen.values())
    out = {0: stage_before or stage} if stage else {}
    out.update({i: before.get(i) or e.est_s.get(scale, DEFAULT_EST_S) for i, e in chosen.items()})
    return out


class ReportProgress:
    """Progress over the report's estimated seconds, with an ETA. On a terminal, a bar that a thread moves through
    each claim's estimate while the claim runs (never past it); otherwise one line per claim as it starts, with the
    estimated time left (the estimates scaled by how the finished claims compared with theirs). Each claim's verdict
    is printed as it lands."""

    def __init__(self, estimates: dict[int, float], stream=None):
        self.estimates, self.stream = estimates, stream or sys.stderr
        self.done_est_s, self.done_s, self.current, self.bar = 0.0, 0.0, None, None

    def __enter__(self):
        if self.stream.isatty():
            import threading

            from tqdm import tqdm

            self.bar = tqdm(total=round(sum(self.estimates.values())), unit="s", file=self.stream, mininterval=1.0,
                            bar_format="{desc} {percentage:3.0f}%|{bar}| {elapsed} elapsed, ETA {remaining}")
            self.stop = threading.Event()
            self.thread = threading.Thread(target=self._tick, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.stop.set()
            self.thread.join()
            self.bar.close()

    def _tick(self):
        import time

        while not self.stop.wait(1.0):
            cur = self.current
            if cur is not None:
                est, start = cur
                self.bar.n = round(self.done_est_s + min(time.perf_counter() - start, 0.95 * est))
                self.bar.refresh()

    def left_s(self) -> float:
        """Estimated seconds left for the claims not finished, scaled by actual / estimated so far."""
        pace = self.done_s / self.done_est_s if self.done_est_s else 1.0
        return pace * (sum(self.estimates.values()) - self.done_est_s)

    def __call__(self, exp, entry):
        import time

        est = self.estimates.get(exp.id, DEFAULT_EST_S)
        if entry is None:
            self.current = (est, time.perf_counter())
            if self.bar is not None:
                self.bar.set_description_str(f"[{exp.id:2d}] {exp.title} (~{est:.0f} s)")
            else:
                print(f"[{exp.id:2d}] {exp.title} ... (~{est:.0f} s; ~{self.left_s():.0f} s left in all)",
                      file=self.stream, flush=True)
            return
        self.current = None
        self.done_est_s += est
        self.done_s += entry["elapsed_s"]
        line = f"     {entry['verdict']}: {entry['figure']} ({entry['elapsed_s']:.1f} s)"
        if self.bar is None:
            print(line, file=self.stream, flush=True)
            return
        self.bar.n = round(self.done_est_s)
        self.bar.write(f"[{exp.id:2d}] {exp.title}:" + line[4:], file=self.stream)
        self.bar.refresh()


def cmd_report(args) -> int:
    from attnlab.report import load_results, run_report, write_report

    set_threads(args.threads)
    if args.history:
        from attnlab.report.references import history_markdown, verdict_history

        rows = verdict_history(args.history)
        if rows is None:
            raise AttnlabError(f"--history {args.history}: git has no committed versions of it here "
                               "(run from a full clone of the repository)")
        print(history_markdown(rows), end="")
        return 0
    if args.from_json:
        results = load_results(args.from_json)
    else:
        only = None
        if args.only:
            try:
                only = [int(x) for x in args.only.split(",") if x.strip()]
            except ValueError:
                raise AttnlabError(f"--only {args.only!r} must be claim numbers, e.g. 1,4,10") from None
        device = resolve_device(args.device)  # no CUDA here: exit 2 now, before any experiment runs
        with ReportProgress(_estimates(args.scale, only, Path(args.out) / "results.json")) as progress:
            results = run_report(args.scale, only, device, progress)
    page = write_report(results, args.out)
    print(f"{len(results['claims'])} claims -> {page} (and results.json)")
    for c in results["claims"]:
        label = c.get("label") or c["verdict"]
        print(f"  {c['id']:2d}. {c['title']:45s} {label:14s} {c['figure']}")
    return 0


def add_report_command(sub) -> None:
    p = sub.add_parser("report", help="run every claim's experiment; write index.html and results.json")
    p.add_argument("--scale", default="quick", choices=("quick", "full"))
    p.add_argument("--only", help="claim numbers, e.g. 1,4,10")
    p.add_argument("--out", default="runs/report")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--from", dest="from_json", help="re-render from a results.json")
    p.add_argument("--history", metavar="RESULTS_JSON", help="print the verdict history of a committed reference "
                   "report (each git version of it) as a Markdown table, e.g. reports/cpu-full/results.json")
    add_threads(p)
    p.set_defaults(func=cmd_report)

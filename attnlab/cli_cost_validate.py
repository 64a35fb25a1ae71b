"""``attnlab cost --validate`` (the cost model against the engine on this machine, on cases drawn afresh, every run
appended to a log) and ``attnlab cost --validate-summary`` (the pass rate over the logged runs); the library parts
are measure.validate and measure.validation_log."""
from __future__ import annotations

import json
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

from attnlab.runtime import set_threads


def cost_validate(args) -> int:
    """Draw the cases (``--seed`` or a fresh one), run the validation, write the full results to ``--out`` and
    append the run to ``--runs`` whatever its outcome, a run that fails midway included."""
    from attnlab.measure import validation_log as log
    from attnlab.measure.validate import validate
    from attnlab.runtime import code_version, machine_context

    set_threads(args.threads or 1)  # one thread unless asked: then the clock is CPU time (see measure.validate)
    seed = args.seed if args.seed is not None else secrets.randbelow(2 ** 31)
    say = lambda text: print(f"attnlab cost --validate: {text}", file=sys.stderr)  # noqa: E731
    say(f"seed {seed} ({'given' if args.seed is not None else 'fresh'}); every run is appended to {args.runs}")
    start = time.perf_counter()
    try:
        res = validate(seed, progress=say)
    except Exception as e:
        git = code_version(ignore=(log.RESULTS_DIR,))
        log.append(args.runs, log.record(None, seed=seed, seed_given=args.seed is not None, git=git,
                                         duration_s=time.perf_counter() - start, context=machine_context(seed=seed),
                                         error=f"{type(e).__name__}: {e}"[:500]))
        say(f"the run failed and is logged as not met in {args.runs}")
        raise
    duration_s = time.perf_counter() - start
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**res, "duration_s": duration_s}, indent=1) + "\n")
    line = log.record(res, seed=seed, seed_given=args.seed is not None, duration_s=duration_s,
                      context=res["context"], git=res["context"]["git"])
    log.append(args.runs, line)
    summary = log.summarize_runs(log.load(args.runs))
    if args.json:
        keys = ("case", "dtype", "phase", "predicted_s", "measured_s", "error", "measured_wall_s", "measured_cpu_s",
                "predicted_by_calibration_s", "predicted_unpaced_s", "error_unpaced", "pace", "parts")
        print(json.dumps({"rows": [{k: r[k] for k in keys} for r in res["rows"]], "summary": res["summary"],
                          "summary_unpaced": res["summary_unpaced"], "seed": seed, "cases": res["cases"],
                          "skipped": res["skipped"], "clock": res["clock"], "threads": res["threads"],
                          "calibration_shapes": res["calibration_shapes"], "results": str(path),
                          "duration_s": duration_s, "runs_log": args.runs, "runs": summary}))
        return 0
    _print_run(res, seed, args.seed is not None)
    print(f"results: {path}; took {duration_s:.0f} s")
    m = summary["machines"][line["machine"]]
    print(f"appended to {args.runs}: {summary['runs']} run(s) recorded, {summary['met']} met the goal; on this machine "
          f"{m['met']} of {m['runs']} (`attnlab cost --validate-summary` for the rule over the last runs)")
    if line["git"] is None or line["git"]["dirty"] is not False:
        print("this run's tree was not clean (or not a git checkout): logged, but not counted in the rule")
    return 0


def _print_run(res: dict, seed: int, seed_given: bool) -> None:
    c = res["calibration_shapes"]
    p = c["probe"]
    print("calibration (micro-benchmarks only, at shapes no case below uses):")
    print(f"  matmul   W x 3W, W x W, W x 4W, 4W x W for W in {c['widths']}: prefill rows {c['prefill_rows']}; "
          f"decode rows {c['decode_rows']} over {c['working_sets_mib'][0]}-{c['working_sets_mib'][-1]} MiB of weights")
    print(f"  attention {c['attention_heads']} heads, head_dim {c['attention_head_dims']}: causal T "
          f"{c['attention_tokens']}; one query over S {c['attention_keys']} keys")
    print(f"  elementwise layer mix on rows {c['elementwise_rows']} x W;  overhead probe: dim {p['dim']}, "
          f"{p['layers']} layers, {p['batch']} sequences, prompt {p['prompt']}")
    comp = c.get("composition")
    if comp:
        models = ", ".join(f"{m[0]} wide x {m[2]} layers" for m in comp["models"])
        print(f"  composition: the engine on whole models ({models}), prompt {comp['prompt']}, "
              f"{comp['batch']} sequences, against the sum of their parts (run once, in the first calibration)")
    print(f"  run {len(res['calibrations'])} times, before, between and after the cases; each case predicted from "
          "the two around it, at the pace a 150 ms pulse saw beside it")
    print(f"cases: {len(res['cases'])} drawn from measure.validate.SPACE with seed {seed} "
          f"({'given' if seed_given else 'fresh'}; --seed {seed} draws them again)")
    print(f"\n{'case':36s} {'phase':8s} {'predicted':>11s} {'measured':>11s} {'error':>8s}  calibrations differ")
    for r in res["rows"]:
        each = r["predicted_by_calibration_s"]
        print(f"{r['case']:36s} {r['phase']:8s} {r['predicted_s'] * 1e3:9.2f}ms {r['measured_s'] * 1e3:9.2f}ms "
              f"{r['error']:+8.1%}  {max(each) / min(each) - 1:6.0%}")
    s = res["summary"]
    a = s["all"]
    by = ", ".join(f"{ph} {s[ph]['median']:.1%} / {s[ph]['worst']:.1%}" for ph in ("prefill", "decode") if ph in s)
    print(f"\n|error| median {a['median']:.1%}, worst {a['worst']:.1%} over {a['n']} ({by}); goal median <= "
          f"{s['goal']['median']:.0%}, worst <= {s['goal']['worst']:.0%}: {'met' if s['met'] else 'NOT met'}")
    u = res["summary_unpaced"]["all"]
    print(f"without scaling to the pace the pulse saw beside each case: median {u['median']:.1%}, "
          f"worst {u['worst']:.1%}")
    ratio = statistics.median(r["measured_wall_s"] / r["measured_cpu_s"] for r in res["rows"])
    if res["clock"] == "cpu":
        print(f"clock: CPU time of the one-thread engine process (its wall time on an idle core); its wall time was "
              f"{ratio:.2f}x that here (load average {res['context']['load_average_end'][0]:.1f} on "
              f"{os.cpu_count()} cores)")
    else:
        print(f"clock: wall time, {res['threads']} threads")
    for sk in res["skipped"]:
        print(f"skipped {sk['case']}: {sk['why']}")


def cost_validate_summary(args) -> int:
    """The pass rate over every run in ``--runs``, and by machine the last counted runs and the rule; the line the
    README quotes comes last."""
    from attnlab.measure import validation_log as log
    from attnlab.runtime import machine_context

    set_threads(args.threads or 1)  # the machine key includes the threads a validation would use
    summary = log.summarize_runs(log.load(args.runs))
    here = log.machine_key(machine_context())
    if args.json:
        print(json.dumps({**summary, "this_machine": here, "readme": log.readme_line(summary)}))
        return 0
    rate = f" ({summary['pass_rate']:.0%})" if summary["runs"] else ""
    print(f"{args.runs}: {summary['runs']} run(s) recorded, {summary['met']} met the goal{rate}")
    for key, m in summary["machines"].items():
        mark = " <- this machine" if key == here else ""
        print(f"\n{key}{mark}: {m['met']} of {m['runs']} met; a run took {m['median_duration_s']:.0f} s (median)")
        need, of = summary["rule"]["need"], summary["rule"]["of"]
        verdict = {True: "met", False: "NOT met", None: f"not decided ({len(m['window'])} of {of} counted runs)"}
        print(f"  goal in {need} of the last {of} counted runs (fresh seed, clean tree): {verdict[m['rule_met']]}")
        for r in m["window"]:
            figures = f"median {r['median']:.1%}, worst {r['worst']:.1%}" if r["median"] is not None else r["error"]
            print(f"  {r['date']}  seed {r['seed']:>10}  {(r['commit'] or '?')[:10]}  {figures}: "
                  f"{'met' if r['met'] else 'NOT met'}")
    if here not in summary["machines"]:
        print(f"\nthis machine ({here}): no run recorded")
    print(f"\nREADME: {log.readme_line(summary)}")
    return 0

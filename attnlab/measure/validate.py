"""Check the cost model against the engine, held out: predicted vs measured prefill and decode times, here.

The ``local`` spec is calibrated by micro-benchmarks only (``measure.calibrate``), at shapes none of the
validation cases below uses (``check_disjoint`` refuses to run otherwise), in the same run: before the first
case, and again after every GROUP cases; each case is predicted from the two calibrations around it (the mean of
the two predictions), because on a shared machine the pace drifts by tens of percent within minutes. A 150 ms
pulse of plain kernels (engine_timing.Pulse: fp32 and bf16 matmul, a memory sum, tiny ops) is timed between the
calibration's benchmarks and between each case's repeats; each part of a prediction is scaled by how much faster
or slower its kind of work ran beside the case than during the calibration (cpu.at_pace). The unscaled
predictions are kept beside (``error_unpaced``).

Each case is a randomly initialised attnlab transformer (seed 0) run by the engine in three fresh processes (each
figure the fastest's, as the calibration's whole models: _measure_group), generating NEW_TOKENS tokens per call
with both clocks read around a prefill-only first step (engine_timing.time_generate): time to first token = until
every sequence has its first token; decode time per step = the rest of the call over the steps it took; each figure
is the median over the repeats, after a warm-up. Reading the decode figure from per-step stamps, not from a
difference of two calls' times, keeps the prefill's noise out of it. With one thread (the default) the clock is the
process's CPU time, which is its wall time on an idle core: on a busy machine a run longer than a scheduler slice
waits for the core, a micro-benchmark shorter than one rarely does, so wall time would compare unlike with like; the
wall times are kept beside. With more threads the clock is wall time. ``cost.cpu`` predicts both figures from the
micro-benchmarks and the tracer's op counts. Error = predicted / measured - 1. Cases in a dtype this CPU only
emulates are skipped, and say so.

The cases are drawn afresh in every run from a stated space (``SPACE``, ``draw_cases``) with a seed chosen for
the run and recorded (``attnlab cost --validate --seed S`` draws the same cases again), so no case can be tuned
on (docs/cost.md tells how fixed cases had been). Every run, met or not, is appended to a log (``validation_log``), whose pass rate is
the figure to quote.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from attnlab.config import ModelConfig

NEW_TOKENS = 17
GOAL = {"median": 0.15, "worst": 0.35}  # |error| over every (case, phase), from the issue: fixed before measuring


@dataclass(frozen=True)
class Case:
    """One validation configuration: a model (width, depth, heads, vocabulary) and a workload (prompt, batch)."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    prompt: int
    batch: int
    dtype: str = "fp32"
    vocab_size: int = 256

    def model_config(self) -> ModelConfig:
        return ModelConfig(dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads, vocab_size=self.vocab_size,
                           max_seq_len=self.prompt + NEW_TOKENS + 8)


def _case(dim, n_layers, n_heads, prompt, batch, dtype="fp32", vocab_size=256) -> Case:
    name = f"d{dim}-H{n_heads}-L{n_layers}-T{prompt}-B{batch}-{dtype}" + (f"-V{vocab_size}" if vocab_size != 256 else "")
    return Case(name, dim, n_layers, n_heads, prompt, batch, dtype, vocab_size)


# The space every run draws its cases from afresh (draw_cases), so that no case can be tuned on. It spans the ten
# fixed cases it replaced (width 128-1024, 2-12 layers, prompts 64-2,048, batch 1-8, fp32 and bf16, GPT-2's
# vocabulary in some); its budgets are those cases' largest, which keeps a run about as long as theirs.
SPACE = {
    "dim": (128, 1024, 64),  # from, to, step
    "head_dim": (32, 64),
    "n_layers": (2, 12),  # from, to
    "prompt": (64, 2048),  # from, to: log-uniform, rounded to a whole token
    "batch": (1, 8),  # from, to
    "dtypes": ("fp32", "bf16"),  # one case each in turn, of those this machine runs natively (runtime.fast_dtypes)
    "vocab_sizes": (256, 50257),  # the second (GPT-2's) with probability gpt2_vocab_p
    "gpt2_vocab_p": 0.2,
    "max_prefill_flops": 45e9,  # prefill_flops(case)
    "max_params": 128e6,  # 12 L d^2 + V d
}
N_CASES = 10


def prefill_flops(case: Case) -> float:
    """FLOPs of a case's prefill: 2 B T (12 L d^2) in the layers' matrices plus 2 B L T^2 d in causal attention."""
    d, L, B, T = case.dim, case.n_layers, case.batch, case.prompt
    return 2 * B * T * 12 * L * d * d + 2 * B * L * T * T * d


def in_space(case: Case, dtypes: tuple[str, ...] = SPACE["dtypes"]) -> bool:
    """Whether ``case`` lies in SPACE, its budgets included, in one of ``dtypes``."""
    sp, (lo, hi, step) = SPACE, SPACE["dim"]
    return (lo <= case.dim <= hi and case.dim % step == 0 and case.dim % case.n_heads == 0
            and case.dim // case.n_heads in sp["head_dim"] and sp["n_layers"][0] <= case.n_layers <= sp["n_layers"][1]
            and sp["prompt"][0] <= case.prompt <= sp["prompt"][1] and sp["batch"][0] <= case.batch <= sp["batch"][1]
            and case.dtype in dtypes and case.vocab_size in sp["vocab_sizes"]
            and prefill_flops(case) <= sp["max_prefill_flops"]
            and 12 * case.n_layers * case.dim ** 2 + case.vocab_size * case.dim <= sp["max_params"])


def draw_cases(seed: int, dtypes: tuple[str, ...] = ("fp32",), n: int = N_CASES) -> list[Case]:
    """``n`` cases drawn from SPACE with ``seed`` (the same seed and dtypes give the same cases), the dtypes in turn.
    A draw outside the budgets, or sharing a shape with the calibration (check_disjoint), is drawn again."""
    import math
    import random

    from attnlab.measure.calibrate import shapes

    rng, sp, calibration = random.Random(seed), SPACE, shapes()
    lo, hi, step = sp["dim"]
    out = []
    while len(out) < n:
        dim, head_dim = rng.randrange(lo, hi + 1, step), rng.choice(sp["head_dim"])
        prompt = round(math.exp(rng.uniform(math.log(sp["prompt"][0]), math.log(sp["prompt"][1]))))
        n_layers, batch = rng.randint(*sp["n_layers"]), rng.randint(*sp["batch"])
        vocab = sp["vocab_sizes"][1] if rng.random() < sp["gpt2_vocab_p"] else sp["vocab_sizes"][0]
        case = _case(dim, n_layers, dim // head_dim, prompt, batch, dtypes[len(out) % len(dtypes)], vocab)
        if in_space(case, dtypes) and not case_shapes(case) & calibration and case not in out:
            out.append(case)
    return out


def case_shapes(case: Case) -> set[tuple]:
    """The shapes a case runs, in calibrate.shapes()'s vocabulary: every matmul of a weight (prefill: B * T rows
    through the layer's matrices, B rows through the head; decode: B rows through all), every attention call
    (prefill T x T; decode one query over each context it sees), the elementwise rows, and the model."""
    d, hidden, D = case.dim, 4 * case.dim, case.dim // case.n_heads
    mats = ((3 * d, d), (d, d), (hidden, d), (d, hidden))
    out = {("model", d, case.n_layers)}
    for rows in (case.batch * case.prompt, case.batch):
        out.update(("linear", rows, i, o) for o, i in mats)
        out.add(("elementwise", rows, d))
    out.add(("linear", case.batch, d, case.vocab_size))
    out.add(("attention", case.prompt, case.prompt, D))
    out.update(("attention", 1, s, D) for s in range(case.prompt + 1, case.prompt + NEW_TOKENS + 1))
    return out


def check_disjoint(cases) -> None:
    """Refuse a validation that shares a shape with the calibration (it would be partly circular)."""
    from attnlab.measure.calibrate import shapes

    calibration = shapes()
    for case in cases:
        shared = case_shapes(case) & calibration
        if shared:
            raise ValueError(f"validation case {case.name} shares shapes with the calibration: {sorted(shared)[:3]}")


def measure(case: Case, repeats: int) -> dict:
    """Time the engine on one case in this process (set_precision for the case's batch, as a server would), with
    the calibration's pulse timed between the repeats."""
    from attnlab.measure.engine_timing import Pulse, time_model

    return time_model(case.model_config(), case.dtype, case.batch, case.prompt, NEW_TOKENS, repeats, min_warm_s=1.0,
                      pulse=Pulse((case.dtype, "fp32")))


def measure_case(case: dict, repeats: int) -> dict:
    """``measure`` on a case given as JSON (what a fresh process receives)."""
    with torch.inference_mode():
        return measure(Case(**case), repeats)


def predict(case: Case, micro: dict, clock: str = "cpu", ops: dict | None = None) -> dict:
    """Predicted prefill and decode seconds, by part (cost.cpu), with the tracer's op counts (``ops``, else
    counted now)."""
    from attnlab.cost import cpu
    from attnlab.cost.arch import from_model_config
    from attnlab.measure.engine_timing import op_counts

    cfg = case.model_config()
    a = from_model_config(cfg)
    ops = ops or op_counts(cfg, case.batch, case.prompt, case.prompt + NEW_TOKENS // 2, case.dtype)
    return {"prefill": cpu.prefill_s(a, case.batch, case.prompt, micro, case.dtype, ops, clock),
            "decode": cpu.decode_s(a, case.batch, case.prompt + NEW_TOKENS // 2, micro, case.dtype, ops, clock),
            "ops": ops}


def summarize(rows: list[dict], key: str = "error") -> dict:
    """Median and worst |error| over the rows (each a case's prefill or decode), overall and by phase, against
    GOAL."""
    out = {}
    for phase in (None, "prefill", "decode"):
        errs = [abs(r[key]) for r in rows if phase is None or r["phase"] == phase]
        if errs:
            out[phase or "all"] = {"median": statistics.median(errs), "worst": max(errs), "n": len(errs)}
    if "all" in out:
        out["goal"] = GOAL
        out["met"] = out["all"]["median"] <= GOAL["median"] and out["all"]["worst"] <= GOAL["worst"]
    return out


def rows_for(case: Case, measured: dict, micros: list[dict], clock: str) -> list[dict]:
    """The table's two rows (prefill, decode) of one case: predicted vs measured (medians) on ``clock``. Each of
    ``micros`` (the calibrations around the case) predicts at its own pace, scaled to the pace the pulse saw
    beside the case (cpu.at_pace); ``predicted_s`` is the mean, ``predicted_unpaced_s`` the same without scaling."""
    from attnlab.cost import cpu

    preds = [predict(case, micros[0], clock)]
    preds += [predict(case, m, clock, preds[0]["ops"]) for m in micros[1:]]
    rows = []
    for phase, key in (("prefill", "ttft"), ("decode", "decode")):
        paced = [cpu.at_pace(p[phase], phase, case.dtype, m, measured["pulse"], clock)
                 for p, m in zip(preds, micros)]
        each = [p["total"] for p in paced]
        p, m = statistics.mean(each), measured[clock][key]
        unpaced = statistics.mean(q[phase]["total"] for q in preds)
        parts = {k: statistics.mean(q[k] for q in paced) for k in paced[0]}
        rows.append({"case": case.name, "dtype": case.dtype, "phase": phase, "predicted_s": p, "measured_s": m,
                     "error": p / m - 1, "predicted_by_calibration_s": each, "predicted_unpaced_s": unpaced,
                     "error_unpaced": unpaced / m - 1, "clock": clock,
                     "pace": [cpu.pace(mi["pulse"], measured["pulse"], clock) for mi in micros],
                     "measured_wall_s": measured["wall"][key], "measured_cpu_s": measured["cpu"][key],
                     "parts": parts, "ops": preds[0]["ops"], "spread": measured["spread"]})
    return rows


PROCESSES = 3  # fresh processes per case, as the calibration's whole models (composition.composition)


def _run_child(case: Case, repeats: int, threads: int) -> dict:
    """One fresh process's timing of ``case`` (no warm caches, its own allocator, glibc's defaults as a user's run
    has)."""
    from attnlab.timing import run_fresh

    return run_fresh("attnlab.measure.validate", "measure_case", [asdict(case), repeats], threads, env={},
                     what=f"timing {case.name}")


def _combine(runs: list[dict]) -> dict:
    """One case's figures from its processes' ``runs``: each figure the fastest process's, as the calibration's whole
    models are timed: now and then one process runs slower throughout (a kernel choice made by measurement as it
    starts, or a neighbour), which is not the engine's pace (docs/cost.md has the figures). The pulse is the
    processes' mean; each process's figures are kept under "processes"."""
    out = dict(runs[0])
    for clock in ("wall", "cpu"):
        out[clock] = {k: min(r[clock][k] for r in runs) for k in runs[0][clock]}
    pulse = runs[0]["pulse"]
    out["pulse"] = {clock: {k: statistics.mean(r["pulse"][clock][k] for r in runs) for k in pulse[clock]}
                    for clock in pulse}
    out["processes"] = [{clock: r[clock] for clock in ("wall", "cpu")} for r in runs]
    return out


def _measure_group(cases: list[Case], repeats: int, threads: int, say) -> dict:
    """name -> figures of each of ``cases``, timed round by round: every case once a round, PROCESSES rounds. One
    case's processes lie a round apart (about a minute), so a slow spell of the machine (tens of seconds) slows
    one of them, not all three."""
    runs: dict = {c.name: [] for c in cases}
    for r in range(PROCESSES):
        for case in cases:
            say(f"{case.name} (process {r + 1}/{PROCESSES})")
            runs[case.name].append(_run_child(case, repeats, threads))
    return {name: _combine(got) for name, got in runs.items()}


GROUP = 5  # cases between two calibrations


def validate(seed: int, cases=None, repeats: int = 5, group: int | None = None, progress=None) -> dict:
    """Calibrate, measure ``group`` (GROUP) cases, calibrate again, ... (torch's thread count as set by the
    caller); predict every case (default: draw_cases(seed) in the dtypes this CPU runs natively) from the
    calibrations around it. The last calibration becomes the cached ``local`` spec. Returns {"rows", "summary",
    "skipped", "calibrations", "seed", ...}; ``progress(text)`` is told each step."""
    import os

    from attnlab.measure import local
    from attnlab.measure.validation_log import RESULTS_DIR
    from attnlab.runtime import code_version, fast_dtypes, machine_context

    say = progress or (lambda text: None)
    native = fast_dtypes("cpu")
    cases = cases or draw_cases(seed, tuple(d for d in SPACE["dtypes"] if d in native))
    group = group or GROUP
    check_disjoint(cases)
    threads = torch.get_num_threads()
    clock = "cpu" if threads == 1 else "wall"
    run = [c for c in cases if c.dtype in native]
    skipped = [{"case": c.name, "why": f"{c.dtype} is emulated on this CPU (no avx512_bf16 or AMX): not timed"}
               for c in cases if c.dtype not in native]
    dtypes = tuple(d for d in ("fp32", "bf16", "int8") if d == "fp32" or any(c.dtype == d for c in run))
    groups = [run[i:i + group] for i in range(0, len(run), group)]

    modules: dict = {}  # the calibration's matrices, built once

    def calibrate(n):
        say(f"calibration {n + 1}/{len(groups) + 1} ({', '.join(dtypes)}; micro-benchmarks only)")
        # the whole models run once, in the first; each later calibration predicts their timings afresh from its own
        # tables (composition.composition)
        return local.calibrate(dtypes, modules, composed=hws[0].micro.get("composition") if n else None)

    hws: list = []
    hws.append(calibrate(0))
    measured = {}
    for g, cases_g in enumerate(groups):
        tell = lambda text, g=g: say(f"[group {g + 1}/{len(groups)}] {text}")  # noqa: E731
        measured.update(_measure_group(cases_g, repeats, threads, tell))
        hws.append(calibrate(g + 1))
    local.save_local(hws[-1])
    modules.clear()  # the matrices are no longer needed
    rows = []
    for g, cases_g in enumerate(groups):
        for case in cases_g:
            rows += rows_for(case, measured[case.name], [hws[g].micro, hws[g + 1].micro], clock)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"rows": rows, "summary": summarize(rows), "summary_unpaced": summarize(rows, "error_unpaced"),
            "skipped": skipped, "clock": clock, "threads": threads,
            "seed": seed, "space": SPACE, "cases": [asdict(c) for c in cases], "new_tokens": NEW_TOKENS, "repeats": repeats,
            "calibration_shapes": hws[0].micro["shapes"],
            "calibrations": [{"hardware": {k: v for k, v in hw.to_dict().items() if k != "micro"}, "micro": hw.micro}
                             for hw in hws],
            "context": {**machine_context(seed=seed), "git": code_version(ignore=(RESULTS_DIR,)), "load_average_end": load}}

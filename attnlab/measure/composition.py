"""The calibration's whole-model check (calibrate.py runs it last): two models run by the engine in fresh
processes, beside the sum of their parts as ``cost.cpu`` predicts it from the other tables."""
from __future__ import annotations

from attnlab.measure import micro
from attnlab.measure.micro import CALIBRATION


def composition(dtypes: tuple[str, ...], micro_so_far: dict, measured: dict | None = None) -> dict:
    """{"rows": [[dim, heads, layers, dtype, measured, predicted]]}: CALIBRATION's composition models run by the
    engine in fresh processes, as a validation case is (measured: {clock: {"ttft", "decode"}} seconds, the fastest
    of ``processes`` runs), beside what ``cost.cpu`` predicts for them from the other tables (``micro_so_far``) as
    the sum of their parts (predicted: {clock: {"prefill", "decode"}}). Why: the parts are timed one kernel at a
    time, each on its own inputs, warm; in the engine each kernel follows another that has just used the caches and
    the core, and the sum came out low on almost every validated case (bf16 prefill by 25-40%), more so the
    narrower the model. cost.cpu scales its sum by the measured ratio (cpu.composition).

    ``measured``: an earlier calibration's composition in the same process, whose whole-model timings are kept
    (not run again) and predicted afresh from these tables. Why afresh: the tables of one calibration differ from
    the next by more than the machine's pace (one run's decode sums for the same model: 19.2, 15.8 and 15.9 ms
    from its three calibrations), so a ratio carries only to the tables it was taken against."""
    from attnlab.cost import cpu
    from attnlab.cost.arch import from_model_config
    from attnlab.measure.engine_timing import op_counts

    c = CALIBRATION.get("composition")
    B, T, new = (c["batch"], c["prompt"], c["new_tokens"]) if c else (0, 0, 0)
    timed_models = (dict(((r[0], r[1], r[2], r[3]), r[4]) for r in measured["rows"]) if measured is not None
                    else _time_composition_models(dtypes))
    rows = []
    for (dim, heads, layers, dtype), t in timed_models.items():
        cfg = _composition_config(dim, heads, layers)
        a = from_model_config(cfg)
        ops = op_counts(cfg, B, T, T + new // 2, dtype)
        predicted = {clock: {
            "prefill": cpu.prefill_s(a, B, T, micro_so_far, dtype, ops, clock, composed=False)["total"],
            "decode": cpu.decode_s(a, B, T + new // 2, micro_so_far, dtype, ops, clock, composed=False)["total"]}
            for clock in ("wall", "cpu")}
        rows.append([dim, heads, layers, dtype, t, predicted])
    return {"rows": rows}


def _composition_config(dim: int, heads: int, layers: int):
    """A composition model's config: room for its prompt and the tokens it generates."""
    from attnlab.config import ModelConfig

    c = CALIBRATION["composition"]
    return ModelConfig(dim=dim, n_layers=layers, n_heads=heads, vocab_size=256,
                       max_seq_len=c["prompt"] + c["new_tokens"] + 8)


def _time_composition_models(dtypes: tuple[str, ...]) -> dict:
    """(dim, heads, layers, dtype) -> {clock: {"ttft", "decode"}}: each composition model timed in ``processes``
    fresh processes, round by round, each figure the fastest process's."""
    from dataclasses import asdict

    from attnlab.timing import run_fresh

    c = CALIBRATION.get("composition")
    if not c:
        return {}
    B, T, new = c["batch"], c["prompt"], c["new_tokens"]
    combos = [(dim, heads, layers, dtype) for dim, heads, layers in c["models"] for dtype in dtypes]
    # Round by round, every (model, dtype) once a round: one model's processes lie a whole round apart, so a slow
    # spell of the machine (tens of seconds) slows one of them, not all, and not one dtype's alone.
    runs: dict = {combo: [] for combo in combos}
    for _ in range(c["processes"]):
        for dim, heads, layers, dtype in combos:
            micro.check_cancel()
            cfg = _composition_config(dim, heads, layers)
            runs[(dim, heads, layers, dtype)].append(run_fresh(
                "attnlab.measure.engine_timing", "time_model_json", [asdict(cfg), dtype, B, T, new, c["repeats"]],
                env={}, what=f"timing the {dim}-wide composition model in {dtype}"))
    # the fastest process's figures: now and then one runs slower throughout (its layouts, chosen by measurement as
    # it started, or a neighbour), which would scale every prediction of its calibration
    return {combo: {clock: {k: min(r[clock][k] for r in got) for k in ("ttft", "decode")} for clock in ("wall", "cpu")}
            for combo, got in runs.items()}

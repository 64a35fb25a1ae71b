"""The cost model on this machine: the calibration micro-benchmarks (at tiny shapes), the held-out validation's
case draw, arithmetic, table and log, the engine's timing of TTFT and decode, and a calibration cancelled midway."""
import json
import threading

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.cost import hardware
from attnlab.cost.arch import from_model_config
from attnlab.models import build_model


TINY_CALIBRATION = {"widths": (40, 72), "prefill_rows": (12, 36), "decode_rows": (1, 3), "working_sets_mib": (0.1, 0.4),
                    "attention_heads": 2, "attention_tokens": (20, 44), "attention_head_dims": (8, 24),
                    "attention_keys": (12, 52), "elementwise_rows": (1, 12), "floor_width": 16, "cold_mib": (0, 1),
                    "probe": {"dim": 16, "n_heads": 2, "vocab_size": 32, "layers": (1, 3), "batch": (1, 2),
                              "prompt": 6, "new_tokens": 4}, "head_vocab": 500,
                    "composition": {"models": ((24, 2, 1),), "prompt": 6, "batch": 2, "new_tokens": 4, "repeats": 2,
                                    "processes": 1}}


@pytest.fixture
def tiny_calibration(monkeypatch, tmp_path):
    """The real micro-benchmarks at tiny shapes (seconds), on one thread (on a shared 2-core machine a second
    thread waits for its partner on every tiny kernel), the cache in a temporary folder."""
    from attnlab.measure import attention_tables, calibrate, composition, elementwise_tables, matmul_tables

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    for module in (calibrate, matmul_tables, attention_tables, elementwise_tables, composition):
        monkeypatch.setattr(module, "CALIBRATION", TINY_CALIBRATION)
    monkeypatch.setattr(attention_tables, "ATTENTION_COLD_BYTES", 2 ** 18)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def test_local_hardware_is_measured_and_cached(tiny_calibration):
    from attnlab.measure import local

    hw = local.spec("local")
    assert hw.peak_flops["fp32"] > 0 and hw.bandwidth_bytes_per_s > 0 and hw.op_overhead_s >= 0
    assert hw.micro["shapes"] == TINY_CALIBRATION and hw.micro["dtypes"][0] == "fp32"
    cache = json.loads((tiny_calibration / "hardware-local.json").read_text())
    assert all(k.endswith(f"|micro-v{local.CALIBRATION_VERSION}") for k in cache["entries"])  # old entries unused
    assert local.spec("local").peak_flops == hw.peak_flops  # read back from the cache, not re-measured
    # the cost model's CPU prediction runs on what was measured: every part of both phases, finite and >= 0
    from attnlab.cost import cpu
    from attnlab.measure.validate import _case, predict

    pred = predict(_case(48, 2, 2, 10, 2), hw.micro)
    for phase in ("prefill", "decode"):
        assert set(pred[phase]) >= {"overhead", "linear", "attention", "elementwise", "total"}
        assert all(v >= 0 and v < float("inf") for v in pred[phase].values())
        assert pred[phase]["total"] == pytest.approx(sum(v for k, v in pred[phase].items() if k != "total"))
    assert cpu.overheads(hw.micro, "cpu")["decode"]["per_op_s"] >= 0
    # the composition model was run by the engine and its ratio to the sum of its parts scales every part
    rows = hw.micro["composition"]["rows"]
    assert {r[3] for r in rows} == set(hw.micro["dtypes"]) and all(r[0] == 24 for r in rows)
    (_, _, _, _, measured, summed), = [r for r in rows if r[3] == "fp32"]
    assert measured["cpu"]["ttft"] > 0 and summed["cpu"]["prefill"] > 0
    ratio = measured["cpu"]["ttft"] / summed["cpu"]["prefill"]
    assert cpu.composition(hw.micro, "fp32", "cpu", "prefill", 48, 2) == pytest.approx(ratio)
    a, ops = from_model_config(_case(48, 2, 2, 10, 2).model_config()), pred["ops"]
    plain = cpu.prefill_s(a, 2, 10, hw.micro, "fp32", ops, "cpu", composed=False)
    assert pred["prefill"]["total"] != pytest.approx(plain["total"]) or ratio == pytest.approx(1.0)
    assert cpu.prefill_s(a, 2, 10, hw.micro, "fp32", ops, "cpu")["total"] == pytest.approx(plain["total"] * ratio)
    # a later calibration keeps the whole models' timings and predicts them afresh from its own tables: a table
    # read twice as slow doubles the predicted sums, and the ratio halves with them
    from attnlab.measure.composition import composition

    slower = json.loads(json.dumps(hw.micro))
    for row in slower["linear"]["fp32"]["decode"]:
        row[-1] = {k: v * 2 for k, v in row[-1].items()} if isinstance(row[-1], dict) else row[-1]
    again = composition(("fp32",), slower, hw.micro["composition"])
    (_, _, _, _, kept, resummed), = [r for r in again["rows"] if r[3] == "fp32"]
    assert kept == measured and resummed["cpu"]["decode"] > summed["cpu"]["decode"]


def test_calibration_shapes_are_disjoint_from_the_validation_cases():
    from attnlab.measure import calibrate
    from attnlab.measure.validate import _case, case_shapes, check_disjoint, draw_cases

    calibration = calibrate.shapes()
    assert len(calibration) > 50
    for seed in range(20):
        cases = draw_cases(seed, ("fp32", "bf16"))
        for case in cases:
            assert not case_shapes(case) & calibration, case.name
        check_disjoint(cases)
    # a case that runs a calibration shape is refused: 48 rows through W = 320 matrices, the prefill table's
    with pytest.raises(ValueError, match="shares shapes with the calibration"):
        check_disjoint([_case(320, 2, 4, 48, 1)])
    with pytest.raises(ValueError, match="shares shapes"):  # the probe model itself
        check_disjoint([_case(16, 1, 2, 100, 1)])
    with pytest.raises(ValueError, match="shares shapes"):  # a composition model itself
        check_disjoint([_case(160, 6, 4, 128, 2)])


def test_validation_cases_are_drawn_from_the_stated_space_by_the_seed():
    """The same seed draws the same cases; another seed others; every case lies in SPACE and its budgets, the dtypes
    in turn; over many seeds the draws reach across the space's ranges."""
    from attnlab.measure.validate import N_CASES, SPACE, _case, draw_cases, in_space, prefill_flops

    both = ("fp32", "bf16")
    assert draw_cases(7, both) == draw_cases(7, both)
    draws = [draw_cases(seed, both) for seed in range(200)]
    assert len({tuple(d) for d in draws}) == len(draws)  # no two seeds drew the same set
    cases = [c for d in draws for c in d]
    assert all(len(d) == N_CASES and len({c.name for c in d}) == N_CASES for d in draws)
    for c in cases:
        assert in_space(c) and prefill_flops(c) <= SPACE["max_prefill_flops"], c.name
        assert c.dim % SPACE["dim"][2] == 0 and c.dim // c.n_heads in SPACE["head_dim"]
    assert all([c.dtype for c in d] == ["fp32", "bf16"] * (N_CASES // 2) for d in draws)
    assert {c.dtype for c in draw_cases(3)} == {"fp32"}  # a machine that only emulates bf16 draws fp32 alone
    # the draws cover the space: each range's ends nearly reached, both vocabularies, every batch and depth
    lo, hi, _ = SPACE["dim"]
    assert min(c.dim for c in cases) == lo and max(c.dim for c in cases) == hi
    assert {c.n_layers for c in cases} == set(range(SPACE["n_layers"][0], SPACE["n_layers"][1] + 1))
    assert {c.batch for c in cases} == set(range(SPACE["batch"][0], SPACE["batch"][1] + 1))
    assert min(c.prompt for c in cases) < 70 and max(c.prompt for c in cases) > 1800
    assert {c.vocab_size for c in cases} == set(SPACE["vocab_sizes"])
    # outside the space: a width off the grid, a head width not listed, a budget exceeded
    assert not in_space(_case(100, 2, 2, 64, 1)) and not in_space(_case(256, 2, 2, 64, 1))
    assert not in_space(_case(1024, 12, 16, 2048, 8))


def test_error_arithmetic_and_summary():
    from attnlab.measure.validate import GOAL, summarize

    rows = [{"phase": "prefill", "error": e} for e in (0.10, -0.20, 0.05)] + \
           [{"phase": "decode", "error": e} for e in (-0.30, 0.12)]
    s = summarize(rows)
    assert s["all"] == {"median": pytest.approx(0.12), "worst": pytest.approx(0.30), "n": 5}
    assert s["prefill"]["median"] == pytest.approx(0.10) and s["decode"]["worst"] == pytest.approx(0.30)
    assert s["goal"] == GOAL and s["met"] is True
    assert summarize(rows + [{"phase": "decode", "error": 0.36}])["met"] is False  # worst over 35%
    assert summarize([{"phase": "decode", "error": e} for e in (0.2, -0.2, 0.1)])["met"] is False  # median over 15%


def _synthetic_micro(flops=1e11, stream=1e10, overhead=1e-5):
    """Calibration figures made up so that every rate is one constant: then a prediction is plain arithmetic."""
    from attnlab.measure.elementwise_tables import elementwise_elements
    from attnlab.measure.micro import CALIBRATION

    t = lambda s: {"wall": s, "cpu": s, "wall_min": s}  # noqa: E731
    zero = t(0.0)
    lin = {"floor": zero, "prefill": [[w, m, t(24 * m * w * w / flops)] for w in (96, 1280) for m in (48, 1536)],
           "decode": [[w, r, ws, t(12 * w * w * 4 / stream)]
                      for w in (96, 1280) for r in (1, 8) for ws in (2 ** 20, 2 ** 28)]}
    H = CALIBRATION["attention_heads"]
    att = {"floor": {"prefill": {"fp32": zero}, "decode": zero},
           "prefill": {"fp32": [[T, D, t(H * 4 * D * T * (T + 1) / 2 / flops)] for T in (96, 1536) for D in (24, 96)]},
           "decode": [[S, D, ws, t(H * S * D * 8 / stream)] for S in (40, 4000) for D in (24, 96)
                      for ws in (2 * H * S * D * 4, 2 ** 26)]}
    ew = {"floor": zero, "rows": [[m, w, elementwise_elements(m, w), t(elementwise_elements(m, w) / 1e9)]
                                  for m in (1, 1536) for w in (96, 1280)]}
    def probe_row(layers, ops):
        t = {"ttft": 1e-3 + ops * overhead, "decode": ops * overhead}
        return [layers, 1, {"wall": t, "cpu": t}, {"prefill": ops, "decode": ops}]
    probe = {"rows": [probe_row(1, 40), probe_row(16, 520)]}
    V = CALIBRATION["head_vocab"]  # the head read hot at twice the streaming rate; 1 ns per logit sampled
    head = {"head": [[w, r, t(w * V * 4 / stream / 2)] for w in (96, 1280) for r in (1, 8)],
            "sample": [[r, t(r * (V - 32) * 1e-9)] for r in (1, 8)], "sample_floor": [[r, zero] for r in (1, 8)]}
    return {"linear": {"fp32": lin}, "attention": att, "elementwise": {"fp32": ew}, "probe": probe, "head": {"fp32": head},
            "memory": {"touch_bytes": 1e9, "touch": t(0.1), "read_bytes": 1e9, "read": t(0.1)}, "shapes": CALIBRATION,
            "compiled_kernels": False}


def test_cpu_prediction_is_the_sum_of_its_parts(monkeypatch):
    """With constant rates the prediction is arithmetic: 2 * M * P_layer / FLOP/s per layer, weight bytes /
    bandwidth, ops * per-op, and so on."""
    from attnlab.cost import cpu
    from attnlab.cost.analytic import params

    micro = _synthetic_micro()
    a = from_model_config(ModelConfig(dim=256, n_layers=4, n_heads=4))
    ops = {"prefill": 150, "decode": 140, "prefill_matmuls": 17, "decode_matmuls": 17}
    P = params(a)["layer_attention"] + params(a)["layer_mlp"]
    pre = cpu.prefill_s(a, 2, 100, micro, "fp32", ops)
    assert pre["overhead"] == pytest.approx(1e-3 + 150 * 1e-5)
    assert pre["linear"] == pytest.approx(4 * 2 * 200 * P / 1e11)
    assert pre["attention"] == pytest.approx(4 * 2 * 4 * 4 * 64 * 100 * 101 / 2 / 1e11)
    assert pre["kv_cache"] == pytest.approx(2 * 4 * 2 * 4 * 101 * 64 * 4 / 1e10)
    dec = cpu.decode_s(a, 2, 300, micro, "fp32", ops)
    assert dec["linear"] == pytest.approx(4 * P * 4 / 1e10)
    assert dec["head"] == pytest.approx(a.vocab_size * a.dim * 4 / 1e10)  # streaming is the slower
    assert dec["sampling"] == pytest.approx(2 * a.vocab_size * 1e-9)
    assert pre["head"] == dec["head"] and pre["sampling"] == dec["sampling"]
    assert dec["attention"] == pytest.approx(4 * 2 * 4 * 301 * 64 * 8 / 1e10)
    assert dec["overhead"] == pytest.approx(140 * 1e-5, abs=1e-9)
    assert dec["total"] == pytest.approx(sum(v for k, v in dec.items() if k != "total"))
    # a head bound by arithmetic (hot at a quarter of the streaming rate): the hot time wins
    slow = {**micro, "head": {"fp32": {**micro["head"]["fp32"], "head": [[w, r, {k: 8 * v for k, v in s.items()}]
                                                                        for w, r, s in micro["head"]["fp32"]["head"]]}}}
    assert cpu.decode_s(a, 2, 300, slow, "fp32", ops)["head"] == pytest.approx(4 * dec["head"])
    # bf16 weights: the cache is read at the width set_precision keeps it (bf16 where the decode kernel reads it,
    # which the calibration records)
    for table in ("linear", "elementwise", "head"):
        micro[table]["bf16"] = micro[table]["fp32"]
    att = micro["attention"]  # bf16 attention at half fp32's FLOP/s: where the cache is bf16, prefill attends in bf16
    att["prefill"]["bf16"] = [[T, D, {k: 2 * v for k, v in s.items()}] for T, D, s in att["prefill"]["fp32"]]
    att["floor"]["prefill"]["bf16"] = att["floor"]["prefill"]["fp32"]
    assert cpu.decode_s(a, 2, 300, micro, "bf16", ops)["attention"] == pytest.approx(dec["attention"])
    assert cpu.prefill_s(a, 2, 100, micro, "bf16", ops)["attention"] == pytest.approx(pre["attention"])
    micro["compiled_kernels"] = True
    assert cpu.decode_s(a, 2, 300, micro, "bf16", ops)["attention"] == pytest.approx(dec["attention"] / 2)
    assert cpu.prefill_s(a, 2, 100, micro, "bf16", ops)["attention"] == pytest.approx(2 * pre["attention"])


def test_composition_is_interpolated_in_depth_then_width():
    """The whole-model ratio (measured / sum of parts) moves with depth as well as width: log-log within each
    width's models, then across widths, clamped at the ends."""
    import math

    from attnlab.cost import cpu

    def row(dim, layers, ratio):
        t = {"ttft": ratio * 1e-3, "decode": 2 * ratio * 1e-4}
        summed = {c: {"prefill": 1e-3, "decode": 2e-4} for c in ("wall", "cpu")}
        return [dim, 4, layers, "fp32", {"wall": t, "cpu": t}, summed]

    micro = {"composition": {"rows": [row(100, 2, 1.6), row(100, 8, 1.1), row(400, 2, 1.2), row(400, 8, 1.0)]}}
    f = lambda dim, layers, phase="prefill": cpu.composition(micro, "fp32", "cpu", phase, dim, layers)  # noqa: E731
    assert f(100, 2) == pytest.approx(1.6) and f(100, 8) == pytest.approx(1.1)
    assert f(400, 8, "decode") == pytest.approx(1.0)
    assert f(100, 4) == pytest.approx(math.sqrt(1.6 * 1.1))  # halfway in log depth: the geometric mean
    assert f(50, 1) == pytest.approx(1.6) and f(800, 12) == pytest.approx(1.0)  # clamped at both ends
    assert f(200, 2) == pytest.approx(math.sqrt(1.6 * 1.2))
    assert cpu.composition(micro, "bf16", "cpu", "prefill", 100, 2) == 1.0  # no bf16 models: the plain sum


def test_a_case_is_the_fastest_of_its_processes_timed_round_by_round(monkeypatch):
    """Each figure of a validation case is the fastest of its fresh processes (as the calibration's whole models are
    timed), the group's cases taking turns so that one case's processes lie a round apart; the pulse is their mean,
    and each process's figures are kept."""
    from attnlab.measure import validate as v

    def record(ttft, decode, pulse):
        t = {"ttft": ttft, "decode": decode}
        return {"wall": t, "cpu": t, "spread": {}, "pulse": {c: {"fp32": pulse} for c in ("wall", "cpu")}}

    a, b = v._case(128, 2, 4, 64, 1), v._case(256, 3, 4, 100, 2)
    figures = {a.name: iter([record(0.030, 0.002, 1e-3), record(0.020, 0.003, 3e-3), record(0.025, 0.004, 2e-3)]),
               b.name: iter([record(0.5, 0.05, 1e-3)] * 3)}
    order = []
    monkeypatch.setattr(v, "_run_child", lambda case, repeats, threads: order.append(case.name) or next(figures[case.name]))
    out = v._measure_group([a, b], 3, 1, lambda text: None)
    assert order == [a.name, b.name] * 3 and v.PROCESSES == 3
    assert out[a.name]["cpu"] == {"ttft": 0.020, "decode": 0.002} and out[a.name]["pulse"]["cpu"]["fp32"] == pytest.approx(2e-3)
    assert [p["cpu"]["ttft"] for p in out[a.name]["processes"]] == [0.030, 0.020, 0.025]
    assert out[b.name]["cpu"] == {"ttft": 0.5, "decode": 0.05}


def test_validate_produces_the_table_and_the_summary(monkeypatch, tmp_path, capsys):
    """The whole --validate path on made-up figures (no timing): calibrations around the cases, one row per case
    and phase with error = predicted / measured - 1, the pace scaling, the summary, the JSON file and the table;
    each run, and a run that fails midway, appended to the log as one line without touching the lines before."""
    from argparse import Namespace

    from attnlab.cli_cost_validate import cost_validate
    from attnlab.measure import validate as v
    from attnlab.measure import validation_log

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    even = {"fp32": 1e-3, "memory": 1e-2, "dispatch": 1e-4}
    micro = {**_synthetic_micro(), "seconds": 0.0, "dtypes": ["fp32"], "pulse": {"wall": even, "cpu": even},
             "composition": {"rows": []}}
    from attnlab.measure import local

    kept = []  # each calibration's ``composed``: the first runs the whole models, the later ones keep its ratios
    monkeypatch.setattr(local, "calibrate", lambda dtypes=None, modules=None, composed=None: kept.append(composed) or
                        hardware.Hardware("local", {"fp32": 1e11}, 1e10, 1e10, 1e-5, "test", micro=micro))
    cases = (v._case(128, 2, 4, 64, 1), v._case(256, 3, 4, 100, 2), v._case(128, 2, 4, 64, 1, "bf16"))
    drawn = []
    monkeypatch.setattr(v, "draw_cases", lambda seed, dtypes: drawn.append((seed, dtypes)) or list(cases))
    monkeypatch.setattr("attnlab.runtime.fast_dtypes", lambda device="cpu": ("fp32",))
    slow_fp32 = {**even, "fp32": 2e-3}  # matrix arithmetic ran at half the calibration's pace beside the cases
    measured = {"wall": {"ttft": 0.02, "decode": 0.004}, "cpu": {"ttft": 0.01, "decode": 0.002},
                "spread": {"ttft_min": 0.01, "ttft_max": 0.01, "decode_min": 0.002, "decode_max": 0.002},
                "pulse": {"wall": slow_fp32, "cpu": slow_fp32}}
    monkeypatch.setattr(v, "_run_child", lambda case, repeats, threads: measured)
    monkeypatch.setattr(v, "GROUP", 1)
    out, runs = tmp_path / "res.json", tmp_path / "runs.jsonl"
    args = dict(threads=1, out=str(out), runs=str(runs), seed=None)
    assert cost_validate(Namespace(**args, json=False)) == 0
    assert drawn[0][1] == ("fp32",) and isinstance(drawn[0][0], int)  # a fresh seed; the dtypes this CPU runs
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert len(res["rows"]) == 4 and res["clock"] == "cpu" and len(res["calibrations"]) == 3  # groups of one case
    assert kept[:3] == [None, micro["composition"], micro["composition"]]
    assert [s["case"] for s in res["skipped"]] == ["d128-H4-L2-T64-B1-bf16"]  # bf16 is "emulated" here
    for r in res["rows"]:
        assert r["measured_s"] == measured["cpu"]["ttft" if r["phase"] == "prefill" else "decode"]
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert r["pace"][0] == {"fp32": 2.0, "memory": 1.0, "dispatch": 1.0}
        if r["phase"] == "prefill":  # the fp32 parts doubled; overhead and memory parts not
            p = r["parts"]
            assert r["predicted_s"] == pytest.approx(r["predicted_unpaced_s"] + (p["linear"] + p["attention"]
                                                                                 + p["elementwise"] + p["sampling"]) / 2)
    assert res["summary"]["all"]["n"] == 4
    assert "predicted" in text and "d256-H4-L3-T100-B2-fp32" in text and "goal median <= 15%" in text
    assert "skipped d128-H4-L2-T64-B1-bf16" in text and "W x 3W" in text and f"seed {drawn[0][0]}" in text
    assert res["context"]["cpu_capability"] and "onednn_bf16" in res["context"] and res["seed"] == drawn[0][0]
    first = runs.read_bytes()
    [line] = validation_log.load(runs)
    assert line["seed"] == drawn[0][0] and line["seed_given"] is False and line["git"] == res["context"]["git"]
    assert [c["name"] for c in line["cases"]] == [c.name for c in cases[:2]]  # the skipped case has no figures
    for c in line["cases"]:
        for phase in ("prefill", "decode"):
            row = next(r for r in res["rows"] if r["case"] == c["name"] and r["phase"] == phase)
            assert c[phase] == {k: row[k] for k in ("predicted_s", "measured_s", "error")}
    a = res["summary"]["all"]
    assert (line["median"], line["worst"], line["met"]) == (a["median"], a["worst"], res["summary"]["met"])
    assert line["goal"] == v.GOAL and line["machine"] and line["duration_s"] >= 0
    assert cost_validate(Namespace(**{**args, "seed": 5}, json=True)) == 0  # a given seed: logged as given
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["all"]["n"] == 4 and len(printed["rows"]) == 4 and printed["seed"] == 5
    assert printed["runs"]["runs"] == 2 and drawn[1][0] == 5
    assert runs.read_bytes().startswith(first)  # appended: the first line is untouched
    assert [r["seed_given"] for r in validation_log.load(runs)] == [False, True]
    monkeypatch.setattr(v, "_run_child", lambda case, repeats, threads: (_ for _ in ()).throw(
        RuntimeError("timing d128 failed: killed")))
    with pytest.raises(RuntimeError, match="killed"):
        cost_validate(Namespace(**args, json=False))
    failed = validation_log.load(runs)[-1]
    assert len(validation_log.load(runs)) == 3 and failed["met"] is False and "killed" in failed["error"]
    assert failed["median"] is None and runs.read_bytes().startswith(first)
    from attnlab.measure.micro import CALIBRATION
    assert printed["calibration_shapes"]["widths"] == list(CALIBRATION["widths"])


def test_stamped_generation_times_decode_apart_from_the_prefill():
    """The decode figure comes from the steps after the first token (both clocks), so a long prompt's prefill
    does not enter it: with the same steps, a 16x longer prompt raises TTFT far more than the decode figure
    (measured: TTFT 3.1x, decode 1.2x)."""
    from attnlab.measure.engine_timing import stamped_generate, time_generate
    from attnlab.engine import generate

    cfg = ModelConfig(dim=32, n_layers=2, n_heads=2, vocab_size=64, max_seq_len=1100)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.inference_mode():
        short, long_ = [[1] * 64], [[1] * 1024]
        one = stamped_generate(model, short, 9)
        assert set(one) == {"wall", "cpu"} and all(t > 0 for c in one.values() for t in c)
        timed = {name: time_generate(model, p, 9, repeats=3, min_warm_s=0.0) for name, p in (("short", short),
                                                                                             ("long", long_))}
        assert set(timed["short"]["spread"]) == {"ttft_min", "ttft_max", "decode_min", "decode_max"}
        ttft_ratio = timed["long"]["wall"]["ttft"] / timed["short"]["wall"]["ttft"]
        decode_ratio = timed["long"]["wall"]["decode"] / timed["short"]["wall"]["decode"]
        assert ttft_ratio > 2 and decode_ratio < 0.6 * ttft_ratio, (ttft_ratio, decode_ratio)
        # it generates what engine.generate does (the same engine, greedy by default)
        assert len(generate(model, short, 9).tokens) == 9
        # the first token is timed after a prefill-only step: a full step also takes a just-prefilled row's second
        from attnlab.engine.engine import Engine, EngineConfig
        from attnlab.engine.request import Request
        for decode, want in ((False, 1), (True, 2)):
            engine = Engine(model, EngineConfig(max_batch=2, max_len=80, paged=False, prefix_reuse=False))
            ids = [engine.add(Request([1] * n, 9)) for n in (64, 40)]
            events = engine.step(decode=decode)
            assert [sum(e.id == i for e in events) for i in ids] == [want, want]


def test_a_cancelled_calibration_stops_and_caches_nothing(monkeypatch, tmp_path):
    """``cancel`` (a server's shutdown) stops the micro-benchmarks before their next timed repeat; no spec is saved,
    and the next calibration on the same thread is not stopped by the old event."""
    from attnlab.measure import local, micro

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    stop = threading.Event()
    stop.set()
    with pytest.raises(micro.Cancelled):
        local.local(cancel=stop)
    assert not (tmp_path / "hardware-local.json").exists()
    assert micro.timed(lambda: None, repeats=1, warm=0)["wall"] >= 0  # the thread's cancel event was reset

"""Smoke tests of benchmarks/decode_vs_hf.py (one clock, alternating order, tuning kept apart from held-out), and
of vs_ctranslate2.py's goals."""
import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.models import build_model
from conftest import tiny

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def dvh(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("decode_vs_hf")


def test_round_order_alternates_abba(dvh):
    from common import round_order

    assert [round_order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    sides = ["a", "b", "c"]  # every side's mean position over an even number of rounds is the same
    pos = {s: sum(round_order(sides, r).index(s) for r in range(4)) for s in sides}
    assert len(set(pos.values())) == 1


def test_speculative_settings_are_tuned_apart_from_the_held_out_prompts(dvh, monkeypatch):
    spec = importlib.import_module("speculative_trained")  # decode_vs_hf's trained section (on the path dvh set)
    monkeypatch.setattr(spec, "DRAFT_KS", (2, 3))  # two settings per method keep the test short
    monkeypatch.setattr(spec, "LOOKUP", (((2, 4), 2), ((1, 3), 3)))
    torch.manual_seed(0)
    target = build_model(tiny(vocab_size=37, dim=32, max_seq_len=512)).eval()
    draft = build_model(tiny(vocab_size=37, n_layers=1, max_seq_len=512)).eval()
    val = torch.randint(0, 37, (20_000,), generator=torch.Generator().manual_seed(0)).tolist()
    res = spec.speculative_section(target, draft, val, ["fp32"], n=5, n_prompts=1, rounds=2)
    for method, n_settings in (("draft", len(spec.DRAFT_KS)), ("lookup", len(spec.LOOKUP))):
        entry = res["fp32"][method]
        assert len(entry["tuning"]) == n_settings  # the whole tuning table is kept
        best = max(entry["tuning"].values(), key=lambda v: v["speedup"])["speedup"]
        assert entry["tuning"][entry["chosen"]]["speedup"] == best
        held = entry["held_out"]
        assert held["rounds"] == 2 and held["speedup_rounds"]["min"] <= held["speedup"] <= held["speedup_rounds"]["max"]
        p = res["prompts"][method]
        assert not set(p["tuning_starts"]) & set(p["held_out_starts"])
    assert res["fp32_greedy_output_identical"]  # greedy speculative equals greedy target in fp32
    assert res["summary"]["fp32"]["lookup"]["chosen"] in res["fp32"]["lookup"]["tuning"]


def test_gpt2_section_times_every_side_on_one_clock(dvh):
    pytest.importorskip("transformers")
    args = argparse.Namespace(quick=True, dtypes=["fp32"], rounds=1, new_tokens=3)
    res = dvh.gpt2_section(args, peak=1e11, bandwidth=1e10)
    assert res["rounds"] == 2 and res["sides"] == ["hf_fp32", "attnlab_fp32"]  # rounded up to even
    assert res["greedy_tokens_identical_to_hf"] == {"fp32": True}
    assert all(v["n"] == 2 for v in res["raw_s"].values())
    r = res["decode_fp32"]["speedup_vs_hf_fp32_rounds"]
    assert r["min"] <= res["decode_fp32"]["speedup_vs_hf_fp32"] <= r["max"]


@pytest.mark.slow
def test_decode_vs_hf_quick_cli(tmp_path):
    out = tmp_path / "decode_vs_hf.json"
    r = subprocess.run([sys.executable, str(BENCH / "decode_vs_hf.py"), "--quick", "--dtypes", "fp32",
                        "--target", str(tmp_path / "none"), "--draft", str(tmp_path / "none"), "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["quick"] and "decode_fp32" in res["gpt2_small"] and "held_out" in res["trained"]["fp32"]["draft"]


@pytest.mark.slow
def test_serve_soak_quick_meets_every_goal(tmp_path):
    """The soak's smoke run: half a minute of mixed and hostile load on a tiny model, every goal met."""
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(BENCH / "serve_soak.py"), "--quick", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["all_met"], res["goals"]
    assert res["status"].get("200", 0) > 100 and res["kinds"]["hostile"] > 20


def test_vs_ctranslate2_judges_an_int8_batch_against_the_best_product_it_can_run_on(monkeypatch):
    """An int8 batch is a share of the best of the fp32, bf16 and int8 peaks, and its 70% goal reads that share: a
    row at 130% of the fp32 peak but 52% of the integer product's fails it (the fp32 peak alone passed it)."""
    monkeypatch.syspath_prepend(str(BENCH))
    vs = importlib.import_module("vs_ctranslate2")
    cfg = argparse.Namespace(n_layers=2, dim=64)
    m = {"cfg": cfg, "nonembed": 100_000, "vocab": 100, "short": 32, "n": 5, "new": 8,
         "bytes_per_token": {"fp32": 4e5, "int8": 1e5}, "kv_bytes_per_token": {"fp32": 512, "int8": 256}, "times": {}}
    flops = vs.generation_flops(m["nonembed"], 2, 64, 100, 128, 8)
    peak, int8_peak = 1e9, 2.5e9
    for dt in ("fp32", "int8"):
        for side in ("attnlab", "ctranslate2"):
            m["times"][(dt, side, 1)] = [(0.01, 0.001)] * 3
            share = 0.6 if dt == "fp32" else 1.3  # of the fp32 peak
            m["times"][(dt, side, 4)] = [4 * flops / (share * peak)] * 3
    rows = vs.summarize_rows(m, ["fp32", "int8"], [4], peak, 1e10, int8_peak)
    assert "attnlab_share_of_int8_peak" not in rows["batch_4_fp32"]
    assert rows["batch_4_int8"]["attnlab_share_of_peak"] == pytest.approx(1.3)
    assert rows["batch_4_int8"]["attnlab_share_of_int8_peak"] == pytest.approx(1.3 / 2.5)
    assert rows["ttft_32_int8"]["attnlab_share_of_int8_peak"] == pytest.approx(
        rows["ttft_32_int8"]["attnlab_share_of_peak"] / 2.5)
    targets = vs.targets_of(rows)
    assert targets["batch_4_int8_ge_70pct_of_peak"] is False
    assert targets["batch_4_fp32_ge_70pct_of_peak"] is False
    low = vs.summarize_rows(m, ["fp32", "int8"], [4], peak, 1e10, 0.5e9)  # no faster product: the fp32 peak judges
    assert low["batch_4_int8"]["attnlab_share_of_int8_peak"] == pytest.approx(1.3)
    assert vs.targets_of(low)["batch_4_int8_ge_70pct_of_peak"] is True

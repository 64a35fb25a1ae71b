"""The report: a registry of claims, verdicts computed from data, a self-contained page checked in Chromium."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from attnlab.experiments import registry
from attnlab.experiments.base import INCONCLUSIVE, NOT_SUPPORTED, SUPPORTED, fit_exponent, verdict
from attnlab.report import load_results, render, run_report
from serving import chromium


def test_every_claim_is_registered_with_its_prediction():
    exps = registry()
    assert sorted(exps) == list(range(1, 19))
    for e in exps.values():
        assert e.claim and e.prediction and e.threshold and e.title
        assert os.path.exists(e.source)


def test_verdict_and_fit_helpers():
    assert verdict(True) == SUPPORTED and verdict(False) == NOT_SUPPORTED and verdict(None) == INCONCLUSIVE
    assert fit_exponent([1, 2, 4, 8], [3, 12, 48, 192]) == pytest.approx(2.0)


def test_verdicts_come_from_the_data():
    res = run_report("quick", only=[4])
    c = res["claims"][0]
    assert c["device"] == "cpu" and res["device"] == "cpu" and res["context"]["device"] == "cpu"
    assert c["verdict"] == SUPPORTED
    dev = c["data"]["max_deviation"]
    assert dev["none"] < 1e-4 < dev["rope"]  # the verdict above follows from these numbers
    html = render(res)
    assert "Order must be injected" in html and "<svg" in html
    speed = res["context"]["host_speed"]  # the host's speed beside the wall time, measured at both ends
    assert speed["start"]["matmul_gflops"] > 0 and speed["end"]["matmul_gflops"] > 0
    assert f"fp32 matmul {speed['start']['matmul_gflops']:.0f} GFLOP/s at the start" in html


def test_quick_report_in_headless_chromium(tmp_path):
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, "-m", "attnlab", "report", "--scale", "quick", "--only", "1,4,6,10",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    results = json.loads((out / "results.json").read_text())
    assert [c["id"] for c in results["claims"]] == [1, 4, 6, 10]
    for c in results["claims"]:
        assert c["verdict"] in (SUPPORTED, NOT_SUPPORTED, INCONCLUSIVE) and c["figure"] and c["plots"]
    # the device each experiment actually ran on: claim 1 traces shapes on the meta device, the rest ran here
    assert {c["id"]: c["device"] for c in results["claims"]} == {1: "meta", 4: "cpu", 6: "cpu", 10: "cpu"}
    ctx = results["context"]
    for key in ("cpu", "cpu_capability", "onednn_bf16", "native_bf16", "amx", "threads", "device", "torch"):
        assert key in ctx, key
    again = subprocess.run([sys.executable, "-m", "attnlab", "report", "--from", str(out / "results.json"),
                            "--out", str(tmp_path / "again")], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "index.html").read_text().count('class="claim"') == 4
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    page = (out / "index.html").as_uri()
    dom = subprocess.run([browser, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console_errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("Error" in line or "Uncaught" in line)]
    assert not console_errors, console_errors
    for c in results["claims"]:
        start = dom.stdout.index(f'id="claim-{c["id"]}"')
        section = dom.stdout[start:dom.stdout.index("</section>", start)]
        assert "<svg" in section and c["verdict"] in section
    shot = out / "screenshot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=390,2400", page], capture_output=True,
                   timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000
    html = (out / "index.html").read_text()
    # self-contained: nothing fetched (a link to the explainer's local page is followed only when clicked)
    assert 'src="http' not in html and not re.search(r'<link[^>]+href="http', html)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_report_on_cuda_without_a_gpu_exits_2_before_running_anything(tmp_path):
    r = subprocess.run([sys.executable, "-m", "attnlab", "report", "--device", "cuda", "--only", "4", "--out",
                        str(tmp_path / "r")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.startswith("attnlab report: error: --device cuda: torch sees no CUDA device")
    assert "use --device cpu" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_bad_results_file(tmp_path):
    from attnlab.errors import AttnlabError

    (tmp_path / "r.json").write_text("{}")
    with pytest.raises(AttnlabError, match="not an attnlab results.json"):
        load_results(tmp_path / "r.json")
    with pytest.raises(AttnlabError, match="no such claim"):
        run_report("quick", only=[99])


def test_results_record_the_code_version_and_the_page_shows_it():
    """No experiment runs: the context every results JSON carries, rendered with one fake claim."""
    from attnlab.runtime import machine_context

    ctx = machine_context(0, device="cpu")
    git = ctx["git"]  # this test runs from a git checkout, so the commit is known
    assert isinstance(git, dict) and len(git["commit"]) == 40 and int(git["commit"], 16) >= 0
    assert git["dirty"] in (True, False)
    claim = {"id": 4, "title": "Order must be injected", "claim": "c", "prediction": "p", "threshold": "t",
             "source": "s.py", "verdict": SUPPORTED, "figure": "f", "elapsed_s": 0.1, "plots": []}
    results = {"scale": "quick", "context": {**ctx, "git": {"commit": "a" * 40, "dirty": True}}, "claims": [claim]}
    html = render(results)
    assert f'<code title="{"a" * 40}">aaaaaaa</code> (uncommitted changes)' in html
    assert "aaaaaaa</code> (uncommitted" not in render({**results, "context": {**ctx, "git": {"commit": "a" * 40,
                                                                                                "dirty": False}}})
    assert "not a git checkout" in render({**results, "context": {**ctx, "git": None}})
    old = {k: v for k, v in ctx.items() if k != "git"}  # a results.json written before the field existed
    assert "code not recorded" in render({**results, "context": old})
    # a dirty tree's run says on its page that it is no reference; a clean one does not
    assert "Not a reference run:</b> run from a tree with uncommitted changes" in html
    clean = {**results, "context": {**ctx, "git": {"commit": "a" * 40, "dirty": False}}}
    assert "Not a reference run" not in render(clean)
    assert "not run from a git checkout" in render({**results, "context": {**ctx, "git": None}})


def test_page_shows_the_regime_and_the_repetitions():
    """An inconclusive verdict says why (regime not reached / unstable) in the table and the section, with each
    measured condition of the regime beside it."""
    from attnlab.experiments.base import REGIME_NOT_REACHED, condition, label
    from attnlab.runtime import machine_context

    ctx = {**machine_context(0, device="cpu"), "git": {"commit": "b" * 40, "dirty": False}}
    cond = condition("decode memory-bound", 3.5, "<= 1.5x the weights-over-bandwidth time", False, "3.5x")
    claim = {"id": 13, "title": "Speculative decoding", "claim": "c", "prediction": "p", "threshold": "t",
             "regime_statement": "a memory-bound target", "source": "s.py", "verdict": "inconclusive",
             "qualifier": REGIME_NOT_REACHED, "regime": [cond], "repeats": ["supported", "not supported"],
             "figure": "f", "elapsed_s": 0.1, "plots": []}
    html = render({"scale": "full", "context": ctx, "claims": [claim]})
    assert html.count(label("inconclusive", REGIME_NOT_REACHED)) == 2  # the claims table and the section's head
    assert "Where the claim applies (stated before measuring).</b> a memory-bound target" in html
    assert "<td>decode memory-bound</td><td>&lt;= 1.5x the weights-over-bandwidth time</td><td>3.5x</td><td>no</td>" in html
    assert "supported · not supported" in html


def test_progress_estimates_and_lines(tmp_path):
    """The ETA comes from the last report at the same scale in the output folder, else each claim's EST_S; in a log
    (not a terminal) each claim prints one line as it starts, with the time left, and one with its verdict."""
    import io
    import types

    from attnlab.cli_report import ReportProgress, _estimates

    exps = registry()
    est = _estimates("quick", [4, 6], tmp_path / "results.json")
    assert est == {4: exps[4].est_s["quick"], 6: exps[6].est_s["quick"]}
    (tmp_path / "results.json").write_text(json.dumps({"scale": "quick", "claims": [{"id": 4, "elapsed_s": 7.5}]}))
    assert _estimates("quick", [4, 6], tmp_path / "results.json")[4] == 7.5
    assert _estimates("full", [4], tmp_path / "results.json")[4] == exps[4].est_s["full"]  # another scale: not used
    out = io.StringIO()
    with ReportProgress({1: 10.0, 2: 10.0}, out) as progress:
        for i in (1, 2):
            claim = types.SimpleNamespace(id=i, title=f"claim {i}")
            progress(claim, None)
            progress(claim, {"verdict": SUPPORTED, "figure": "x", "elapsed_s": 20.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "[ 1] claim 1 ... (~10 s; ~20 s left in all)"
    assert lines[2] == "[ 2] claim 2 ... (~10 s; ~20 s left in all)"  # the first took twice its estimate
    assert lines[3] == "     supported: x (20.0 s)"

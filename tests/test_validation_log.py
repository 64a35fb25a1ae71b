"""The cost validation's run log (measure.validation_log): lines only appended, the pass rate and the 4-of-5 rule on
made-up runs, and the README quoting the rate of the log as committed."""
import json
import subprocess
from pathlib import Path

import pytest

from attnlab.measure import validation_log as log

ROOT = Path(__file__).resolve().parents[1]
A = {"cpu": "CPU A", "cpu_capability": "AVX512", "threads": 1}
B = {"cpu": "CPU B", "cpu_capability": "AVX2", "threads": 1}


def run(met, context=A, seed=1, dirty=False, seed_given=False, commit="c0"):
    """A made-up log line, as record() writes it (only the fields the summary reads)."""
    return {"machine": log.machine_key(context), "met": met, "seed": seed, "seed_given": seed_given,
            "git": {"commit": commit, "dirty": dirty}, "median": 0.1 if met else 0.2, "worst": 0.3 if met else 0.5,
            "date": "2026-12-02T17:00:00+00:00", "duration_s": 200.0, "error": None}


def test_append_adds_lines_and_never_rewrites_earlier_ones(tmp_path):
    path = tmp_path / "sub" / "runs.jsonl"
    assert log.load(path) == []
    log.append(path, run(True, seed=1))
    first = path.read_bytes()
    log.append(path, run(False, seed=2))
    assert path.read_bytes().startswith(first) and path.read_text().count("\n") == 2
    assert [r["seed"] for r in log.load(path)] == [1, 2]
    with open(path, "ab") as f:  # a line cut short (a killed writer): the next run starts on a line of its own
        f.write(b'{"seed": 3')
    log.append(path, run(True, seed=4))
    assert path.read_bytes().startswith(first)
    with pytest.raises(ValueError, match="line 3: not a JSON run record"):  # never skipped silently
        log.load(path)


def test_pass_rate_and_the_four_of_five_rule_on_made_up_runs():
    # machine A: an old failure, then 5 counted runs with 4 met; a dirty run and a given seed between them (both
    # failed) are in the pass rate but not in the window; machine B: 3 runs only
    runs = [run(False, seed=0), run(True), run(True), run(False, dirty=True), run(False), run(True),
            run(False, seed_given=True), run(True), run(True, B), run(False, B), run(True, B)]
    s = log.summarize_runs(runs)
    assert (s["runs"], s["met"]) == (11, 6) and s["pass_rate"] == pytest.approx(6 / 11)
    a, b = s["machines"][log.machine_key(A)], s["machines"][log.machine_key(B)]
    assert (a["runs"], a["met"], a["pass_rate"]) == (8, 4, 0.5)
    assert [w["met"] for w in a["window"]] == [True, True, False, True, True] and a["window_met"] == 4
    assert a["rule_met"] is True
    assert (b["runs"], b["met"], b["rule_met"], len(b["window"])) == (3, 2, None, 3)  # not yet decided
    # one more failure on A: the window slides to 3 of 5, the rule fails; the old runs do not rescue it
    a = log.summarize_runs(runs + [run(False)])["machines"][log.machine_key(A)]
    assert [w["met"] for w in a["window"]] == [True, False, True, True, False] and a["rule_met"] is False
    # exactly 4 of 5 holds, 3 of 5 does not
    assert log.summarize_runs([run(m) for m in (True, False, True, True, True)])["machines"][
        log.machine_key(A)]["rule_met"] is True
    assert log.summarize_runs([run(m) for m in (True, False, True, False, True)])["machines"][
        log.machine_key(A)]["rule_met"] is False
    # an unknown tree (no git) is not counted
    assert not log.counted({**run(True), "git": None}) and log.counted(run(True))


def test_machine_key_separates_cpus_isa_limits_and_threads():
    keys = {log.machine_key(c) for c in (A, B, {**A, "threads": 2}, {**A, "isa_limits": {"ONEDNN_MAX_CPU_ISA": "AVX2"}})}
    assert len(keys) == 4 and log.machine_key(A) == "CPU A (AVX512; 1 thread)"


def test_readme_line():
    assert log.readme_line(log.summarize_runs([])) == "Recorded runs: none yet."
    line = log.readme_line(log.summarize_runs([run(True)] * 4 + [run(False), run(True, B)]))
    assert line.startswith("Recorded runs: 5 of 6 met the goal (83%).")
    assert "CPU A (AVX512; 1 thread): 4 of 5; goal in 4 of the last 5: met" in line
    assert "CPU B (AVX2; 1 thread): 1 of 1; goal in 4 of the last 5: not yet decided (1 of 5 counted runs)" in line


def test_readme_quotes_the_pass_rate_of_the_committed_log():
    """The README's sentence is the one the committed log gives (`attnlab cost --validate-summary` prints it): a
    run committed to the log without updating the README, or a README figure edited by hand, fails here."""
    try:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{log.RUNS_PATH}"], capture_output=True,
                               text=True, timeout=10)
        inside = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git is not available")
    if inside.returncode != 0:
        pytest.skip("not a git checkout")
    runs = log.parse(shown.stdout) if shown.returncode == 0 else []  # not committed yet: no run recorded
    readme = " ".join((ROOT / "README.md").read_text().split())  # the sentence may wrap across lines
    assert log.readme_line(log.summarize_runs(runs)) in readme


def test_summary_command_prints_the_rule_and_the_readme_line(tmp_path, capsys):
    from argparse import Namespace

    from attnlab.cli_cost_validate import cost_validate_summary
    from attnlab.runtime import machine_context

    here = {**machine_context(), "threads": 1}
    path = tmp_path / "runs.jsonl"
    for met in (True, True, False, True, True):
        log.append(path, run(met, here))
    assert cost_validate_summary(Namespace(runs=str(path), threads=None, json=False)) == 0
    text = capsys.readouterr().out
    assert "5 run(s) recorded, 4 met the goal (80%)" in text and "<- this machine" in text
    assert "goal in 4 of the last 5 counted runs (fresh seed, clean tree): met" in text
    assert text.strip().endswith(log.readme_line(log.summarize_runs(log.load(path))))
    assert cost_validate_summary(Namespace(runs=str(path), threads=None, json=True)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["this_machine"] == log.machine_key(here) and printed["machines"][log.machine_key(here)]["rule_met"]

"""A committed reference must reproduce from a commit: the reference report's claims are rerun once the code they
run changes, and a benchmark result from a dirty tree never sits among the references."""
import json
import subprocess
from pathlib import Path

import pytest

from attnlab.experiments import registry
from attnlab.report import reference_status
from attnlab.report.references import (ROOT, claim_files, import_closure, stale_claims, unusable_results)

REFERENCE = ROOT / "reports" / "cpu-full" / "results.json"


def test_import_closure_follows_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "attnlab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n    from attnlab.c import thing\n")
    (pkg / "sub" / "b.py").write_text("import os\n")
    (pkg / "c.py").write_text("thing = 1\n")
    (pkg / "sub" / "kernel.cpp").write_text("// built on first use\n")
    (pkg / "d.py").write_text("")  # imported by nobody
    assert import_closure("attnlab.sub.a", tmp_path) == {"attnlab", "attnlab.sub", "attnlab.sub.a", "attnlab.sub.b",
                                                         "attnlab.c"}
    assert "attnlab/sub/kernel.cpp" in claim_files("attnlab.sub.a", tmp_path)  # package data beside the code
    assert "attnlab/d.py" not in claim_files("attnlab.sub.a", tmp_path)


def _git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_stale_claims_names_the_claims_whose_code_changed(tmp_path):
    """A made-up repository: claim 1 imports a helper, claim 2 does not; changing the helper marks claim 1 only."""
    exp = tmp_path / "attnlab" / "experiments"
    exp.mkdir(parents=True)
    for p in (tmp_path / "attnlab" / "__init__.py", exp / "__init__.py"):
        p.write_text("")
    (tmp_path / "attnlab" / "helper.py").write_text("X = 1\n")
    (exp / "e01_a.py").write_text("from attnlab.helper import X\n")
    (exp / "e02_b.py").write_text("Y = 2\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "x", "--allow-empty")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "code")
    first = _git(tmp_path, "rev-parse", "HEAD")
    results = {"context": {"git": {"commit": first, "dirty": False}},
               "claims": [{"id": 1, "source": "attnlab/experiments/e01_a.py"},
                          {"id": 2, "source": "attnlab/experiments/e02_b.py"}]}
    assert stale_claims(results, root=tmp_path) == {}
    (tmp_path / "attnlab" / "helper.py").write_text("X = 2\n")
    _git(tmp_path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "change the helper")
    assert stale_claims(results, root=tmp_path) == {1: ["attnlab/helper.py"]}
    assert stale_claims({**results, "context": {"git": {"commit": "f" * 40}}}, root=tmp_path) is None  # unknown


def test_unusable_results_and_reference_status(tmp_path):
    clean = {"context": {"git": {"commit": "a" * 40, "dirty": False}}}
    files = {"clean.json": clean, "dirty.json": {"context": {"git": {"commit": "a" * 40, "dirty": True}}},
             "none.json": {"context": {}}, "mixed.json": {**clean, "sections_from_earlier_run": {"trained": "x"}}}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    (tmp_path / "bad.json").write_text("{")
    out = {Path(p).name: why for p, why in unusable_results(sorted(tmp_path.glob("*.json"))).items()}
    assert set(out) == {"dirty.json", "none.json", "mixed.json", "bad.json"}
    assert reference_status(clean["context"])["usable"] is True
    assert reference_status(files["dirty.json"]["context"])["usable"] is False
    assert reference_status({})["usable"] is False


def test_committed_benchmark_results_are_references():
    """Every JSON directly in benchmarks/results/ came from a clean tree at a named commit (dirty runs live in
    benchmarks/results/not-reference/, which says why)."""
    bad = unusable_results(sorted((ROOT / "benchmarks" / "results").glob("*.json")))
    assert not bad, "move these to benchmarks/results/not-reference/ or rerun them from a clean tree: " + repr(bad)


def test_every_claim_states_its_regime():
    missing = [e.id for e in registry().values() if not e.regime.strip()]
    assert not missing, f"claims without a REGIME (where the claim applies, stated before measuring): {missing}"


def test_reference_report_matches_the_code_its_claims_run():
    results = json.loads(REFERENCE.read_text())
    assert reference_status(results["context"])["usable"], "the reference report was written from a dirty tree"
    stale = stale_claims(results)
    if stale is None:
        pytest.skip("git cannot compare the reference report's commit with HEAD here (not a full clone)")
    assert not stale, ("reports/cpu-full no longer reproduces from HEAD; rerun `attnlab report --scale full` for "
                       "claims " + ", ".join(f"{i} ({', '.join(files[:3])})" for i, files in sorted(stale.items())))


def test_verdict_history_table_is_current():
    from attnlab.report.references import history_markdown, verdict_history

    rows = verdict_history("reports/cpu-full/results.json")
    if rows is None:
        pytest.skip("no git history of the reference report here (not a full clone)")
    assert history_markdown(rows) in (ROOT / "reports" / "HISTORY.md").read_text(), (
        "reports/HISTORY.md is behind: `attnlab report --history reports/cpu-full/results.json` prints the table")

"""Installed, not just editable: a wheel built from the repo holds every file the package reads at run time,
and the report runs from it alone (a target folder on PYTHONPATH, another working directory)."""
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_installs_and_runs_the_report_outside_the_repo(tmp_path):
    # Build from a copy of the sources: setuptools' build/ folder in the repo could hold stale files that a
    # wheel would then ship (and that would hide a file missing from the sources).
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "runs", "benchmarks",
        "reports", "tests"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), "."], cwd=src, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((tmp_path / "dist").glob("attnlab-*.whl"))
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(REPO).as_posix() for p in (REPO / "attnlab").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert "attnlab/report/template.html" in data
    assert data <= shipped, f"missing from the wheel: {sorted(data - shipped)}"

    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import attnlab; print(attnlab.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, timeout=120)
    assert pathlib.Path(where.stdout.strip()).is_relative_to(site), where.stdout + where.stderr  # not the repo's
    r = subprocess.run([sys.executable, "-m", "attnlab", "report", "--only", "4", "--out", str(tmp_path / "r")],
                       cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    page = tmp_path / "r" / "index.html"
    assert page.exists() and "Order must be injected" in page.read_text()

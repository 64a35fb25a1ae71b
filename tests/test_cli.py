"""The command line, run as a user runs it: a real subprocess, real files, exit codes."""
import json
import subprocess
import sys

import pytest


def run(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, input=stdin,
                          timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    r = run("train", "--preset", "tiny", "--steps", "20", "--batch-size", "4", "--seq-len", "32",
            "--eval-every", "10", "--out", str(out), "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_train_writes_the_checkpoint_folder(trained):
    out, summary = trained
    for name in ("config.json", "model.safetensors", "manifest.json", "metrics.jsonl", "trainer_state.safetensors"):
        assert (out / name).exists(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("step" in r for r in rows) and any("loss" in r for r in rows)
    assert summary["final_step"] == 20


def test_generate_and_json(trained):
    out, _ = trained
    r = run("generate", str(out), "--prompt", "def ", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert len(res["tokens"]) == 8 and res["ttft_s"] > 0 and res["cache_bytes"] > 0
    r = run("generate", str(out), "--max-new-tokens", "3", stdin="import ")
    assert r.returncode == 0, r.stderr


def test_info_for_checkpoint_and_preset(trained):
    out, _ = trained
    r = run("info", str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["params"] > 0
    r = run("info", "gpt2", "--json")
    info = json.loads(r.stdout)
    assert info["params"] == 124_439_808 and info["state_bytes_per_token"] == 73_728  # 72 KiB/token fp32


@pytest.mark.parametrize("args,needle", [
    (["train", "--out", "x", "--family", "mamba"], "invalid choice: 'mamba'"),
    (["train", "--out", "x", "--kernel", "flashy"], "invalid choice: 'flashy'"),
    (["train", "--out", "x", "--pos", "xpos"], "invalid choice: 'xpos'"),
    (["train", "--out", "x", "--n-heads", "3"], "n_heads=3 must divide dim=128"),
    (["train", "--out", "x", "--steps", "0"], "steps=0 must be > 0"),
    (["generate", "/nonexistent/ckpt", "--prompt", "a"], "no such checkpoint folder"),
    (["info", "nope"], "neither a checkpoint folder nor a preset"),
    ([], "required"),
])
def test_invalid_usage_exits_2_with_one_line(args, needle):
    r = run(*args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_empty_prompt_and_empty_corpus(trained, tmp_path):
    out, _ = trained
    r = run("generate", str(out), "--prompt", "")
    assert r.returncode == 2 and "prompt is empty" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run("train", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--steps", "1")
    assert r.returncode == 2 and "empty or too small" in r.stderr

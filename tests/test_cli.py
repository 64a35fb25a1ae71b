"""The command line, run as a user runs it: a real subprocess, real files, exit codes."""
import json
import subprocess
import sys

import pytest
import torch


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


@pytest.mark.parametrize("family", ["lstm", "linear", "ssm"])
def test_info_gives_a_fixed_state_its_bytes(family):
    from attnlab.cli import describe
    from attnlab.config import ModelConfig
    from attnlab.models import build_model

    cfg = ModelConfig(family=family, pos="none", dim=32, n_layers=2, n_heads=4, vocab_size=40)
    info = describe(cfg)
    assert info["state_bytes_per_token"] == 0
    assert info["state_bytes_fixed"] == build_model(cfg).new_state(1).nbytes > 0


@pytest.mark.parametrize("args,needle", [
    (["train", "--out", "x", "--family", "mamba"], "invalid choice: 'mamba'"),
    (["train", "--out", "x", "--kernel", "flashy"], "invalid choice: 'flashy'"),
    (["train", "--out", "x", "--pos", "xpos"], "invalid choice: 'xpos'"),
    (["train", "--out", "x", "--n-heads", "3"], "n_heads=3 must divide dim=128"),
    (["train", "--out", "x", "--steps", "0"], "steps=0 must be > 0"),
    (["generate", "/nonexistent/ckpt", "--prompt", "a"], "no such checkpoint folder"),
    (["info", "nope"], "unknown model 'nope': give a preset"),
    ([], "required"),
])
def test_invalid_usage_exits_2_with_one_line(args, needle):
    r = run(*args)
    assert r.returncode == 2
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("args", [["train", "--preset", "tiny", "--steps", "1"], ["bench", "attention"],
                                  ["report", "--only", "4"]])
def test_device_cuda_without_a_gpu_exits_2(tmp_path, args):
    r = run(*args, "--device", "cuda", "--out", str(tmp_path / "out")) if args[0] != "bench" else \
        run(*args, "--device", "cuda")
    assert r.returncode == 2 and "--device cuda: torch sees no CUDA device" in r.stderr, r.stderr
    assert "use --device cpu" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_empty_prompt_and_empty_corpus(trained, tmp_path):
    out, _ = trained
    r = run("generate", str(out), "--prompt", "")
    assert r.returncode == 2 and "prompt is empty" in r.stderr
    (tmp_path / "empty").mkdir()
    r = run("train", "--data", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--steps", "1")
    assert r.returncode == 2 and "empty or too small" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--max-new-tokens", "0"], "max_new_tokens=0 must be > 0"),
    (["--max-new-tokens", "5000"], "max_new_tokens=5000 leaves no room"),
    (["--temperature", "-0.5"], "temperature=-0.5 must be >= 0"),
    (["--top-p", "0"], "top_p=0.0 must be in (0, 1]"),
    (["--top-k", "-1"], "top_k=-1 must be >= 0"),
    (["--prompt-lookup", "--k", "-1"], "--k -1: a speculative round needs at least 1 draft token"),
])
def test_generate_bad_sampling_flags(trained, args, needle):
    out, _ = trained
    r = run("generate", str(out), "--prompt", "x", *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_generate_prompt_too_long_and_truncate(trained):
    out, _ = trained  # the tiny preset's context is 256 tokens
    r = run("generate", str(out), "--prompt", "a" * 300, "--max-new-tokens", "4")
    assert r.returncode == 2 and "prompt of 300 tokens + max_new_tokens 4 exceeds the model's context of 256" in r.stderr
    r = run("generate", str(out), "--prompt", "a" * 300, "--max-new-tokens", "4", "--truncate", "left", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["prompt_tokens"] == 252


def test_generate_invalid_utf8_stdin(trained):
    out, _ = trained
    r = subprocess.run([sys.executable, "-m", "attnlab", "generate", str(out)], input=b"ok \xff\xfe",
                       capture_output=True, timeout=120)
    assert r.returncode == 2 and b"not valid UTF-8" in r.stderr


def test_generate_modes_agree(trained):
    out, _ = trained
    base = ["generate", str(out), "--prompt", "def main():", "--max-new-tokens", "12", "--json"]
    plain = json.loads(run(*base).stdout)
    for extra in (["--no-cache"], ["--prompt-lookup", "--k", "3"], ["--draft", str(out)]):
        r = run(*base, *extra)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] == plain["tokens"], extra
    r = run(*base[:-1], "--stream")
    assert r.returncode == 0 and r.stdout.rstrip("\n") == plain["text"].rstrip("\n")
    for dtype in ("bf16", "int8"):
        r = run(*base, "--dtype", dtype)
        assert r.returncode == 0 and len(json.loads(r.stdout)["tokens"]) == 12, r.stderr


def test_generate_draft_with_other_vocabulary(trained, tmp_path):
    out, _ = trained
    r = run("train", "--preset", "tiny", "--task", "copy", "--synth-vocab", "20", "--steps", "2", "--batch-size", "2",
            "--seq-len", "16", "--out", str(tmp_path / "d"), "--quiet")
    assert r.returncode == 0, r.stderr
    r = run("generate", str(out), "--prompt", "x", "--draft", str(tmp_path / "d"))
    assert r.returncode == 2 and "draft's vocabulary (20) differs from the target's (256)" in r.stderr


def test_generate_from_a_hugging_face_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50,
                                                              n_positions=64))
    hf.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(50)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    r = run("generate", str(tmp_path), "--prompt", "w1 w2 w3", "--max-new-tokens", "5", "--ignore-eos", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 5

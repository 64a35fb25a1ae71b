"""The load generator against a real `attnlab serve` subprocess on a tiny model (loopback, a free port)."""
import json
import random

import httpx
import pytest
import torch

from attnlab.cli import main
from attnlab.serve.launch import LaunchedServer
from attnlab.serve.loadgen import Lengths, LoadSpec, make_requests, percentile, run_load

CONTEXT = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from attnlab.config import ModelConfig
    from attnlab.data.tokenizers import BPETokenizer
    from attnlab.models import build_model
    from attnlab.models.hf import save_hf

    folder = tmp_path_factory.mktemp("tiny-serve")
    tok = BPETokenizer.train(["def add(a, b):\n    return a + b\n" * 20, "hello world, hello load\n" * 20], 280)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=4, max_seq_len=CONTEXT, pos="learned",
                      mlp="gelu", norm="layernorm", bias=True, tie_embeddings=True)
    save_hf(build_model(cfg), folder, tokenizer=tok, eos_token_id=0)
    with LaunchedServer(str(folder), ["--threads", "1", "--max-batch", "4"]) as s:
        yield s


def _ordered(d: dict) -> bool:
    return d["p50"] <= d["p95"] <= d["p99"] <= d["max"]


def test_closed_loop_counts_and_ordered_percentiles(server):
    spec = LoadSpec(requests=8, concurrency=4, prompt_len=Lengths.parse("8:32"), output_len=Lengths.parse("8"),
                    warmup=1, seed=3)
    res = run_load(server.url, spec)
    assert (res["requests"], res["ok"], res["failed"], res["failed_by"]) == (8, 8, 0, {})
    assert res["output_tokens"] == 64 and res["server"]["context"] == CONTEXT
    vocab = httpx.get(server.url + "/api/info").json()["vocab_size"]  # random ids stay below the server's vocabulary
    assert [r["prompt_tokens"] for r in res["per_request"]] == [len(r.prompt) for r in make_requests(spec, vocab)]
    for r in res["per_request"]:
        assert r["output_tokens"] == 8 and r["usage"]["completion_tokens"] == 8 and r["finish_reason"] == "length"
        assert 0 < r["ttft_s"] <= r["e2e_s"] and r["max_itl_s"] <= r["e2e_s"]
    assert res["server_usage"]["token_count_mismatches"] == 0
    for key in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        assert res[key]["n"] > 0 and _ordered(res[key]), (key, res[key])
    assert res["max_itl_s"] == res["itl_s"]["max"] and res["itl_s"]["n"] == 8 * 7
    assert res["output_tok_per_s"] == pytest.approx(64 / res["wall_s"])
    assert 0 < res["mean_in_flight"] <= 4 + 1e-6  # never more than the 4 clients in flight


def test_poisson_arrivals_follow_the_seeded_gaps(server):
    spec = LoadSpec(requests=5, rate=40.0, prompt_len=Lengths.parse("8"), output_len=Lengths.parse("4"), seed=7)
    res = run_load(server.url, spec)
    assert res["ok"] == 5 and res["output_tokens"] == 20
    rng, at = random.Random("arrivals-7"), 0.0
    for r in res["per_request"]:
        at += rng.expovariate(40.0)
        assert at - 1e-3 <= r["sent_s"] <= at + 0.5  # sent at its arrival time (open loop), not after the others
    assert "poisson, 40.0 req/s" in res["spec"]["arrivals"]


def test_bad_requests_are_counted_by_status(server):
    spec = LoadSpec(requests=6, concurrency=3, prompt_len=Lengths.parse("16"), output_len=Lengths.parse("8:300"),
                    seed=1)
    too_long = sum(16 + r.max_tokens > CONTEXT for r in make_requests(spec, 256))
    assert 0 < too_long < 6  # this seed mixes good and bad requests
    res = run_load(server.url, spec)
    assert res["failed_by"] == {"400": too_long} and res["ok"] == 6 - too_long
    assert any("exceed the model's context" in e for e in res["errors"])
    bad = [r for r in res["per_request"] if r["status"] == 400]
    assert len(bad) == too_long and all(r["output_tokens"] == 0 for r in bad)


def test_text_prompts(server):
    res = run_load(server.url, LoadSpec(requests=2, concurrency=2, prompts=["def add(a, b):", "hello"],
                                        output_len=Lengths.parse("3")))
    assert res["ok"] == 2 and res["output_tokens"] == 6
    assert all(r["prompt_tokens"] is None and r["usage"]["prompt_tokens"] > 0 for r in res["per_request"])


def test_cli_json_parses(server, capsys):  # main() is the console script's entry point (no new interpreter)
    assert main(["bench", "serve", "--url", server.url, "--concurrency", "2", "--requests", "3", "--prompt-len", "8",
                 "--output-len", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] == 3 and res["output_tokens"] == 12 and res["spec"]["concurrency"] == 2


def test_cli_table_and_usage_errors(server, capsys):
    assert main(["bench", "serve", "--url", server.url, "--requests", "2", "--prompt-len", "4",
                 "--output-len", "3", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "ok 2, failed 0" in out and "TTFT" in out and "closed loop, 1 clients" in out
    assert main(["bench", "serve", "--requests", "2"]) == 2
    assert "give the server to load" in capsys.readouterr().err
    assert main(["bench", "serve", "--url", server.url, "--prompt-len", "9:3"]) == 2
    assert "lo <= hi" in capsys.readouterr().err
    assert main(["bench", "attention", "--seq-lens", "x"]) == 2  # `bench attention` unchanged
    assert "comma-separated integers" in capsys.readouterr().err


def test_lengths_spec_and_percentiles():
    assert Lengths.parse("128") == Lengths("fixed", 128, 128)
    assert Lengths.parse("64:512") == Lengths("uniform", 64, 512)
    logn = Lengths.parse("lognormal:100:0.5:400")
    rng = random.Random(0)
    draws = [logn.draw(rng) for _ in range(2000)]
    assert 1 <= min(draws) and max(draws) <= 400 and 85 <= percentile(draws, 50) <= 115
    for bad in ("0", "5:3", "x", "lognormal:10:0", "a:b:c"):
        with pytest.raises(ValueError):
            Lengths.parse(bad)
    for kw in (dict(), dict(rate=1.0, concurrency=2), dict(rate=0.0), dict(concurrency=0), dict(requests=0, rate=1.0)):
        with pytest.raises(ValueError):
            LoadSpec(**kw)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5 and percentile([], 50) is None
    spec = LoadSpec(concurrency=1, prompt_len=Lengths.parse("4:9"), output_len=Lengths.parse("2:5"), seed=5)
    assert make_requests(spec, 100) == make_requests(spec, 100)  # seeded: the same requests every time
    assert make_requests(spec, 100) != make_requests(LoadSpec(concurrency=1, seed=6, prompt_len=spec.prompt_len), 100)


@pytest.mark.slow
def test_serve_load_benchmark_quick(tmp_path):
    """The benchmark's smoke run: a tiny model, a few requests, every section, pass/fail computed."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "serve_load.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "serve_load.py"
    r = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    tp = res["throughput"]
    assert tp["all_runs_complete"] and res["context"]["threads"] == 2
    assert tp["peers"]["hf_generate"]["status"] == tp["peers"]["hf_generate_batch"]["status"] == "ran"
    # both HF paths greedy, fp32, on the engine's prompts: the same tokens, sequence for sequence
    assert tp["greedy_sequences_equal_to_engine"]["hf_generate"]["min"] == 1.0
    assert tp["greedy_sequences_equal_to_engine"]["hf_generate_batch"]["min"] == 1.0
    assert {row["clients"] for row in res["load_table"]} == {1, 4}
    assert all(row["failed"] == 0 and row["cached_tokens"] == 0 for row in res["load_table"])
    assert set(res["chunked_prefill"]["median"]) == {"0", "32", "64"}
    assert all(isinstance(v, (bool, str)) for v in res["targets"].values())


def test_server_drains_and_exits_0_on_sigterm(server):  # last: it stops the module's server
    code = server.stop()
    assert code == 0, f"exit {code} (-9: still running {server.stop_s:.0f} s after SIGTERM); its log:\n{server.log()}"

"""The server, end to end: a real `attnlab serve` subprocess on 127.0.0.1, real HTTP clients (httpx, the openai
library), a real model folder. What runs alone must run the same among others; bad input is refused before
any compute; nothing leaks (blocks, memory); SIGTERM drains."""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import time

import httpx
import pytest

from serving import Server, make_tiny_folder

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_folder(tmp_path_factory.mktemp("tiny"), chat_template=CHAT_TEMPLATE, context=1024)


@pytest.fixture(scope="module")
def server(folder):
    with Server(folder, "--max-batch", "32", "--prefill-chunk", "64") as s:
        yield s


def _ids(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1, 300) for _ in range(n)]


def _complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"temperature": 0, "ignore_eos": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


async def _stream(client: httpx.AsyncClient, url: str, body: dict) -> tuple[str, list[dict]]:
    chunks = []
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks


def _idle(server: Server, timeout_s: float = 10.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.metric("attnlab_running_sequences") == 0 and server.metric("attnlab_kv_blocks_used") == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the server did not return to idle (sequences or KV blocks still held)")


# -- continuous batching ----------------------------------------------------------------------------------------
def test_sixteen_concurrent_streams_equal_each_run_alone(server):
    prompts = [_ids(8 + 9 * i, seed=i) for i in range(16)]  # ragged: 8 .. 143 tokens, two prefill chunks for some
    alone = [_complete(server.url, prompt=p, max_tokens=24, logprobs=0) for p in prompts]

    async def together():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*[
                _stream(client, server.url, {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                                             "logprobs": 0, "stream_options": {"include_usage": True}})
                for p in prompts])

    both = asyncio.run(together())
    for a, (text, chunks) in zip(alone, both):
        tokens = [t for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                  for t in c["choices"][0]["logprobs"]["tokens"]]
        assert tokens == a["choices"][0]["logprobs"]["tokens"]
        assert text == a["choices"][0]["text"]
        assert len(chunks) == 24 + 1 and chunks[-1]["usage"]["completion_tokens"] == 24  # a chunk per token + usage
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    _idle(server)


def test_openai_client_chat_stream_and_prefix_cache_on_second_turn(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    turn1 = [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": "def dumps(obj):"}]
    r1 = client.chat.completions.create(model=model, messages=turn1, max_tokens=12, temperature=0)
    answer = r1.choices[0].message.content
    assert r1.choices[0].message.role == "assistant" and r1.usage.completion_tokens >= 1
    assert r1.usage.prompt_tokens > 16  # at least one full block to reuse
    turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and loads?"}]
    stream = client.chat.completions.create(model=model, messages=turn2, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens >= 1
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached >= 16, f"second turn reused {cached} of {usage.prompt_tokens} prompt tokens"
    assert cached >= r1.usage.prompt_tokens - 16  # everything of turn 1 up to its last partial block
    done = client.completions.create(model=model, prompt="import json\n", max_tokens=5, temperature=0)
    assert done.choices[0].finish_reason in ("stop", "length") and done.usage.prompt_tokens > 0
    assert server.metric("attnlab_prefix_cache_hit_rate") > 0
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)


# -- bad input --------------------------------------------------------------------------------------------------
BAD = [  # (body, status, param)
    ({"prompt": "", "max_tokens": 4}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [5] * 1024, "max_tokens": 1}, 400, "prompt"),
    ({"prompt": [5] * 1000, "max_tokens": 100}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 4.0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "4"}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, 400, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "n": 2}, 400, "n"),
    ({"prompt": "x", "max_token": 4}, 400, "max_token"),
    ({"prompt": [1, 10 ** 6]}, 400, "prompt"),
    ({"max_tokens": 4}, 400, "prompt"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[json.dumps(b)[:40] for b, _, _ in BAD])
def test_bad_completion_bodies(server, body, status, param):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param and err["message"]


@pytest.mark.parametrize("raw,code", [(b'{"prompt": "x", ', "invalid_json"), (b'{"prompt": "\xff\xfe"}', "invalid_encoding"),
                                      (b'{"prompt": "x", "temperature": NaN}', "invalid_json"), (b'[1, 2]', "invalid_json")])
def test_malformed_bodies(server, raw, code):
    r = httpx.post(server.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == code


def test_chat_bad_input_and_errors_in_openai_shape(server):
    url = server.url + "/v1/chat/completions"
    assert httpx.post(url, json={"messages": []}).json()["error"]["param"] == "messages"
    r = httpx.post(url, json={"messages": [{"role": "wizard", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")
    r = httpx.post(url, json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(server.url + "/v1/completions", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    # none of it left anything behind, and good requests still run
    _idle(server)
    assert _complete(server.url, prompt="x", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_api_key(folder):
    with Server(folder, "--api-key", "s3cret") as s:
        body = {"prompt": "x", "max_tokens": 1}
        assert httpx.post(s.url + "/v1/completions", json=body).status_code == 401
        r = httpx.post(s.url + "/v1/completions", json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(s.url + "/v1/models").status_code == 401
        ok = httpx.post(s.url + "/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200


# -- cancellation, overload, preemption ---------------------------------------------------------------------------
def test_disconnect_frees_blocks_within_a_step(server):
    before = server.metric("attnlab_cancelled_requests_total")
    body = {"prompt": _ids(40, 7), "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", server.url + "/v1/completions", json=body) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break  # leave mid-stream
        assert server.metric("attnlab_kv_blocks_used") > 0 or server.metric("attnlab_cancelled_requests_total") > before
    _idle(server, timeout_s=5)
    assert server.metric("attnlab_cancelled_requests_total") == before + 1
    # non-streaming: a client that sends and hangs up
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        payload = json.dumps({**body, "stream": False}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        deadline = time.time() + 10
        while server.metric("attnlab_running_sequences") == 0 and time.time() < deadline:
            time.sleep(0.01)
    _idle(server, timeout_s=5)
    assert server.metric("attnlab_cancelled_requests_total") == before + 2
    status = {}
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith('attnlab_requests_total{endpoint="/v1/completions"'):
            status[line.split('status="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    assert status.get("499", 0) >= 2  # both hang-ups, streaming and not, count as 499, not 200


def test_overload_answers_429_at_once(folder):
    with Server(folder, "--max-batch", "1", "--max-queue", "2") as s:
        async def burst():
            async with httpx.AsyncClient(timeout=120) as client:
                async def one():
                    t0 = time.perf_counter()
                    r = await client.post(s.url + "/v1/completions", json={"prompt": _ids(20, 1), "max_tokens": 900,
                                                                           "ignore_eos": True})
                    return r, time.perf_counter() - t0
                return await asyncio.gather(*[one() for _ in range(8)])

        results = asyncio.run(burst())
        codes = sorted(r.status_code for r, _ in results)
        # a queue of 2 (plus the one running, if it was admitted before the others arrived); the rest refused
        assert 2 <= codes.count(200) <= 3 and set(codes) <= {200, 429}, codes
        quickest_200 = min(took for r, took in results if r.status_code == 200)
        for r, took in results:
            if r.status_code == 429:  # refused at once: no waiting for a slot, no compute
                assert r.headers["retry-after"] and r.json()["error"]["code"] == "queue_full"
                assert took < min(2.0, quickest_200 / 2), f"a 429 took {took:.2f} s"


def test_preemption_under_a_tiny_kv_pool_loses_nothing(folder):
    prompts = [_ids(20 + 3 * i, seed=50 + i) for i in range(5)]
    with Server(folder, "--kv-blocks", "14") as s:  # 224 tokens of KV for five requests of ~150 tokens each
        alone = [_complete(s.url, prompt=p, max_tokens=120)["choices"][0]["text"] for p in prompts]

        async def together():
            async with httpx.AsyncClient(timeout=300) as client:
                rs = await asyncio.gather(*[client.post(s.url + "/v1/completions", json={
                    "prompt": p, "max_tokens": 120, "temperature": 0, "ignore_eos": True}) for p in prompts])
                return [r.json() for r in rs]

        out = asyncio.run(together())
        assert [o["choices"][0]["text"] for o in out] == alone
        assert all(o["usage"]["completion_tokens"] == 120 for o in out)
        assert s.metric("attnlab_preemptions_total") > 0
        _idle(s)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": [1] * 200, "max_tokens": 100})
        assert r.status_code == 400 and r.json()["error"]["code"] == "kv_capacity"


def _rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_soak_of_mixed_requests_leaves_nothing_behind(server):
    good = {"prompt": "import json\n", "max_tokens": 6, "temperature": 0.8, "top_k": 20}
    bads = [b for b, _, _ in BAD]

    async def soak(n: int):
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=120) as client:
            async def one(i):
                async with sem:
                    if i % 3 == 0:
                        r = await client.post(server.url + "/v1/completions", json=bads[i % len(bads)])
                        return r.status_code
                    if i % 3 == 1:
                        _, chunks = await _stream(client, server.url, {**good, "seed": i})
                        return 200 if chunks else 0
                    r = await client.post(server.url + "/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4})
                    return r.status_code
            return await asyncio.gather(*[one(i) for i in range(n)])

    asyncio.run(soak(60))  # warm-up: imports, caches, histograms
    # the cost model's machine calibration (started in the background at start-up) allocates its test matrices:
    # wait for it (this call blocks until it is done) so that it is not counted as growth
    assert httpx.get(server.url + "/api/predict?prompt_tokens=8", timeout=300).status_code == 200
    _idle(server)  # the worker trims the heap when it goes idle: what stays resident is what is held
    rss0 = _rss_bytes(server.proc.pid)
    codes = asyncio.run(soak(300))
    assert codes.count(200) == 200 and codes.count(400) == 100, sorted(set(codes))
    _idle(server)
    assert server.metric("attnlab_queue_length") == 0
    grown = _rss_bytes(server.proc.pid) - rss0
    assert grown < 16 * 2 ** 20, f"resident memory grew by {grown / 2**20:.1f} MiB over 300 requests"


# -- shutdown ---------------------------------------------------------------------------------------------------
def test_sigterm_drains_running_requests_and_exits_0(folder):
    s = Server(folder, "--drain-s", "30")

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            streams = [asyncio.ensure_future(_stream(client, s.url, {"prompt": _ids(30, i), "max_tokens": 300,
                                                                      "temperature": 0, "ignore_eos": True}))
                       for i in range(2)]
            while s.metric("attnlab_generation_tokens_total") < 4:
                await asyncio.sleep(0.01)
            s.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # no longer listening
                await client.post(s.url + "/v1/completions", json={"prompt": "x"})
            return await asyncio.gather(*streams)

    try:
        results = asyncio.run(run())
        for text, chunks in results:
            assert chunks[-1]["choices"][0]["finish_reason"] == "length" and len(chunks) == 300
        assert s.wait(60) == 0, s.log()
        assert "drained" in s.log()
    finally:
        s.kill()


def test_sigterm_cancels_a_calibration_in_progress(folder, tmp_path, monkeypatch):
    """A first start on a new machine calibrates the cost model in the background (a minute or more on 2 cores).
    SIGTERM does not wait for it: the calibration is cancelled, the server exits 0 at once, and nothing
    half-measured is cached."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))  # an empty cache (inherited by the server): it calibrates
    s = Server(folder)
    try:
        time.sleep(1.0)  # into the calibration
        s.proc.send_signal(signal.SIGTERM)
        assert s.wait(30) == 0, s.log()
        assert "drained" in s.log()
        assert not (tmp_path / "hardware-local.json").exists(), "the calibration ran to its end: nothing was cancelled"
    finally:
        s.kill()


def test_sigterm_cuts_requests_past_the_drain_time(folder):
    # The drain is far shorter than the stream: the tiny model decoded its 989 tokens in 0.45-0.54 s on the AMD
    # EPYC of session 12, so a 0.5 s drain let the stream end in some runs
    s = Server(folder, "--drain-s", "0.1")
    try:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", s.url + "/v1/completions", json={
                    "prompt": _ids(30, 3), "max_tokens": 990, "temperature": 0, "ignore_eos": True,
                    "stream": True}) as r:
                lines = r.iter_lines()
                next(lines)
                t0 = time.perf_counter()
                s.proc.send_signal(signal.SIGTERM)
                got = []
                try:
                    got += [line for line in lines if line.startswith("data: {")]
                except httpx.HTTPError:
                    pass  # the server closed the stream
        assert len(got) < 989, "the stream ran to its end: nothing was cut at the drain time"
        assert s.wait(30) == 0, s.log()
        assert time.perf_counter() - t0 < 15
    finally:
        s.kill()


# -- other architectures ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["mistral-window8", "qwen2"])
def test_serves_mistral_sliding_window_and_qwen2_folders_like_transformers(tmp_path, arch):
    """A sliding-window Mistral runs on contiguous ring caches (no paging), Qwen2 on the paged pool; both greedy
    streams, four at once, equal transformers' own greedy generate. No tokenizer.json: token-id prompts only."""
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=97, max_position_embeddings=128, bos_token_id=0, eos_token_id=0)
    if arch == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, tie_word_embeddings=True)).eval()
    else:
        hf = transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=8)).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    prompts = [_ids(5 + 4 * i, seed=i) for i in range(4)]
    prompts = [[t % 97 for t in p] for p in prompts]
    expected = []
    for p in prompts:
        out = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
        expected.append(out[0, len(p):].tolist())
    with Server(tmp_path) as s:
        async def together():
            async with httpx.AsyncClient(timeout=120) as client:
                rs = await asyncio.gather(*[client.post(s.url + "/v1/completions", json={
                    "prompt": p, "max_tokens": 20, "temperature": 0, "ignore_eos": True, "logprobs": 0})
                    for p in prompts])
                return [r.json() for r in rs]

        got = asyncio.run(together())
        for g, want in zip(got, expected):
            assert g["choices"][0]["logprobs"]["tokens"] == [f"token_id:{t}" for t in want]
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "text", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_tokenizer"

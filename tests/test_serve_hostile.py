"""The server as a hostile client meets it: bodies that used to crash it get JSON 4xx in OpenAI's shape, what a
foreign web page can make a browser send is refused, one tenant cannot probe another's cached prompts, a request
past its deadline ends with an error the client sees, and none of it hurts a good request running beside it."""
import asyncio
import json

import httpx
import pytest

from attnlab.errors import ConfigError
from attnlab.serve.config import ServeConfig
from serving import Server, make_tiny_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_folder(tmp_path_factory.mktemp("tiny"), context=1024)


@pytest.fixture(scope="module")
def server(folder):
    with Server(folder, "--request-timeout", "30") as s:
        yield s


GOOD = {"prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 24, "temperature": 0, "ignore_eos": True}


def _post(url, body=None, raw=None, headers=None):
    if raw is None:
        raw = json.dumps(body).encode()
    return httpx.post(url + "/v1/completions", content=raw, timeout=60,
                      headers={"content-type": "application/json", **(headers or {})})


def _error(r, status):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize("raw,code", [
    (b'{"prompt": "\\ud800"}', "invalid_encoding"),  # a lone surrogate: valid JSON, not valid text
    (b'{"prompt": "x", "stop": ["\\udc00"]}', "invalid_encoding"),
    (b'{"prompt": "x", "stop": "\\ud83d"}', "invalid_encoding"),
    (b"[" * 100_000, "invalid_json"),  # nesting past the parser's recursion
    (b'{"prompt": "x", "user": ' + b"[" * 40 + b"]" * 40 + b"}", "invalid_json"),
])
def test_bodies_that_crashed_the_server_get_a_json_400(server, raw, code):
    assert _error(_post(server.url, raw=raw), 400)["code"] == code


def test_hostile_values_are_refused_and_do_not_touch_a_good_request_beside_them(server):
    alone = _post(server.url, GOOD).json()["choices"][0]["text"]
    hostile = [{"prompt": "x", "temperature": 1, "repetition_penalty": 1e-300},
               {"prompt": "x", "repetition_penalty": 1e300}, {"prompt": "x", "stop": ["y" * 600, "z" * 600]},
               {"prompt": "x", "cache_salt": ""}]

    async def together():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                client.post(server.url + "/v1/completions", json=GOOD),
                *[client.post(server.url + "/v1/completions", json=b) for b in hostile])

    good, *bad = asyncio.run(together())
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == alone
    assert [_error(r, 400)["param"] for r in bad] == ["repetition_penalty", "repetition_penalty", "stop", "cache_salt"]


def test_browser_safe_defaults(server):
    # a "simple" cross-site POST (no CORS preflight): refused before any work
    r = httpx.post(server.url + "/v1/completions", content=json.dumps(GOOD), headers={"content-type": "text/plain"})
    assert _error(r, 415)["code"] == "unsupported_media_type"
    r = _post(server.url, GOOD, headers={"origin": "http://evil.example"})
    assert _error(r, 403)["code"] == "origin_not_allowed" and "--allow-origin" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/models", headers={"origin": "http://evil.example"}).status_code == 403
    assert _post(server.url, GOOD, headers={"origin": server.url}).status_code == 200  # the server's own page


def test_an_allowed_origin_and_a_key_from_a_file(folder, tmp_path):
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    with Server(folder, "--api-key-file", str(key), "--allow-origin", "http://localhost:3000") as s:
        auth = {"authorization": "Bearer s3cret"}
        assert _post(s.url, GOOD, headers={"origin": "http://localhost:3000", **auth}).status_code == 200
        assert _post(s.url, GOOD, headers={"origin": "http://localhost:3001", **auth}).status_code == 403
        assert _error(_post(s.url, GOOD), 401)["type"] == "authentication_error"


def test_binding_beyond_loopback_needs_a_key_or_insecure():
    with pytest.raises(ConfigError, match="--api-key-file"):
        ServeConfig(host="0.0.0.0")
    ServeConfig(host="0.0.0.0", api_key="k")
    ServeConfig(host="0.0.0.0", insecure=True)
    ServeConfig(host="::1")
    with pytest.raises(ConfigError, match="origin"):
        ServeConfig(allow_origins=("localhost:3000",))


def test_the_prefix_cache_is_salted_per_request(server):
    prompt = list(range(1, 120))
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    cached = lambda salt: _post(server.url, {**body, "cache_salt": salt}).json()["usage"][
        "prompt_tokens_details"]["cached_tokens"]
    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0  # another tenant learns nothing from a's prompt
    assert cached("tenant-a") >= 96  # a's own second request reuses its blocks
    usage = _post(server.url, body).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # unsalted requests are a tenant of their own
    assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]


def test_a_request_past_its_deadline_ends_with_an_error_the_client_sees(folder):
    body = {"prompt": [5, 6, 7], "max_tokens": 1000, "temperature": 0, "ignore_eos": True}
    with Server(folder, "--request-timeout", "0.05", "--max-tokens-cap", "1000") as s:
        assert _error(_post(s.url, body), 408)["code"] == "request_timeout"
        with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["error"]["code"] == "request_timeout"  # not a chunk with an invented finish_reason
        reasons = {c["finish_reason"] for e in events[:-2] for c in json.loads(e)["choices"]}
        assert reasons <= {None}
        text = httpx.get(s.url + "/metrics").text
        assert 'attnlab_requests_total{endpoint="/v1/completions",status="408"}' in text
        for name in ("attnlab_engine_step_errors_total", "attnlab_engine_sequence_errors_total",
                     "attnlab_preemptions_total"):
            assert f"# TYPE {name} counter" in text and f"\n{name} " in text
        assert httpx.get(s.url + "/health").status_code == 200


def test_a_timed_out_request_ends_even_when_the_engine_never_answers(monkeypatch):
    """A worker whose engine thread is not running (dead or stuck in one long forward) must not hold a client past
    its deadline plus the abort's grace: the run ends with a cancelled event of its own."""
    from types import SimpleNamespace

    import torch

    from attnlab.engine.engine import Engine, EngineConfig
    from attnlab.engine.request import CANCELLED
    from attnlab.models import build_model
    from attnlab.serve import completion
    from attnlab.serve.worker import Worker
    from conftest import tiny

    monkeypatch.setattr(completion, "ABORT_GRACE_S", 0.2)
    torch.manual_seed(0)
    worker = Worker(Engine(build_model(tiny()).eval(), EngineConfig(max_batch=2)), max_queue=4)  # never started
    req = SimpleNamespace(seed=0, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0, ignore_eos=True)
    state = SimpleNamespace(served=SimpleNamespace(stop_tokens=[]), worker=worker)

    async def go():
        run = completion.Run(state, [1, 2, 3], 8, req, [], None, deadline_s=0.05)
        return run, await asyncio.wait_for(run.next(), 5)

    run, event = asyncio.run(go())
    assert run.timed_out and event.state == CANCELLED and event.done

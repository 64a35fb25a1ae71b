"""The one engine API: ``add`` / ``step`` / ``abort`` / ``stats`` / ``check``, events that say how each request ended,
and the engine as the only owner of the scheduler, the pool's size and the paged/contiguous decision."""
import math
import re
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.data.tokenizers import ByteTokenizer
from attnlab.engine import generate
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.request import CANCELLED, FAILED, FINISHED, RUNNING, Request, RequestError
from attnlab.engine.sampling import SamplingParams
from attnlab.engine.speculative import LookupProposer
from attnlab.errors import AttnlabError, ConfigError
from attnlab.models import build_model
from conftest import tiny


def lively(**kw):
    """A random model whose greedy output is not just 'repeat the last token' (untied, larger init)."""
    torch.manual_seed(0)
    return build_model(tiny(tie_embeddings=False, init_std=0.2, **kw)).eval()


def drain(engine) -> list:
    events = []
    while engine.has_work:
        events += engine.step()
    return events


def of(events, rid) -> list:
    return [e for e in events if e.id == rid]


def test_only_the_engine_builds_a_scheduler_or_sizes_a_pool():
    """generate, speculative decoding, the cost model's timing and the server all go through Engine."""
    root = Path(attnlab.__file__).parent
    builders, sizers = set(), set()
    for path in root.rglob("*.py"):
        text, name = path.read_text(), path.relative_to(root).as_posix()
        if re.search(r"(?<!class )\bScheduler\(", text):
            builders.add(name)
        # a definition, or the inference wrapper handing the call to its model, sizes nothing
        if re.search(r"(?<!def )(?<!self\.model\.)\bnew_pool\(", text) and not name.startswith("models/"):
            sizers.add(name)
    assert builders == {"engine/engine.py"} and sizers == {"engine/engine.py"}, (builders, sizers)


def test_events_of_a_finished_request_carry_its_tokens_text_and_result():
    model = lively(vocab_size=256, max_seq_len=128)
    tok = ByteTokenizer()
    engine = Engine(model, EngineConfig(max_batch=2), tok)
    rid = engine.add(Request("def f(x):", 10, top_logprobs=2))
    events = drain(engine)
    assert {e.id for e in events} == {rid}
    assert [e.state for e in events] == [RUNNING] * 9 + [FINISHED]
    last = events[-1]
    assert last.finish_reason == "length" and last.error is None and all(e.result is None for e in events[:-1])
    ref = generate(model, list(b"def f(x):"), 10, tokenizer=tok)
    assert [e.token for e in events] == last.result.tokens == ref.tokens
    assert [e.logprob for e in events] == pytest.approx(ref.completions[0].logprobs, abs=1e-5)
    assert "".join(e.text for e in events) == last.result.text == ref.completions[0].text == tok.decode_text(ref.tokens)
    assert all(len(e.top) == 2 and e.top[0][1] >= e.top[1][1] for e in events)
    assert last.result.prompt_tokens == 9 and len(last.result.stamps_s) == 10


def test_a_stop_string_finishes_with_stop_and_is_never_shown():
    model = lively(vocab_size=256, max_seq_len=128)
    tok = ByteTokenizer()
    base = generate(model, list(b"hello"), 30).tokens
    i = next(i for i in range(1, len(base) - 1) if base[i] < 128 and base[i + 1] < 128
             and bytes(base[i:i + 2]) not in bytes(base[:i + 1]))
    stop = bytes(base[i:i + 2]).decode()  # spans two tokens
    engine = Engine(model, EngineConfig(), tok)
    rid = engine.add(Request(list(b"hello"), 30, stop_strings=[stop]))
    events = of(drain(engine), rid)
    assert events[-1].state == FINISHED and events[-1].finish_reason == "stop"
    assert [e.token for e in events] == base[:i + 2]
    assert "".join(e.text for e in events) == events[-1].result.text == tok.decode_text(base[:i])


def test_abort_ends_a_request_with_a_cancelled_event_and_the_rest_go_on():
    model = lively()
    engine = Engine(model, EngineConfig(max_batch=2))
    a = engine.add(Request([1, 2, 3], 20))
    b = engine.add(Request([4, 5, 6, 7], 20))
    waiting = engine.add(Request([8, 9], 5))  # no room in a batch of 2 yet
    before = engine.step() + engine.step()
    engine.abort(a)
    engine.abort(waiting)
    engine.abort(a)  # twice, or an unknown id: nothing more happens
    engine.abort(12345)
    events = engine.step()
    ends = [e for e in events if e.done]
    assert [(e.id, e.state, e.finish_reason, e.token) for e in ends[:2]] == [
        (a, CANCELLED, "cancelled", None), (waiting, CANCELLED, "cancelled", None)]
    assert ends[0].result.tokens == [e.token for e in of(before, a)] and ends[1].result.tokens == []
    events += drain(engine)
    assert not of(events[2:], a) and not of(events[2:], waiting)
    rest = of(before + events, b)
    assert rest[-1].state == FINISHED and [e.token for e in rest] == generate(model, [4, 5, 6, 7], 20).tokens


def test_a_fault_of_its_own_fails_one_request_with_a_failed_event():
    """Non-finite logits (an extreme repetition penalty): the request fails alone, even in a library engine
    (raise_faults=True raises only for a failed forward); generate() turns it into an error."""
    model = lively()
    engine = Engine(model, EngineConfig(max_batch=2))
    bad = engine.add(Request([1, 2, 3], 8, SamplingParams(temperature=1.0, repetition_penalty=1e-300)))
    good = engine.add(Request([4, 5, 6], 8))
    events = drain(engine)
    last = of(events, bad)[-1]
    assert last.state == FAILED and last.finish_reason == "error" and "non-finite" in last.error
    assert last.token is None and last.result.error == last.error
    assert of(events, good)[-1].state == FINISHED
    assert engine.stats()["sequence_errors"] == 1
    with pytest.raises(AttnlabError, match="generation failed: .*non-finite"):
        generate(model, [1, 2, 3], 8, SamplingParams(temperature=1.0, repetition_penalty=1e-300))


@pytest.mark.parametrize("request_kw,field,code,match", [
    (dict(prompt=[]), "prompt", "invalid_value", "prompt is empty"),
    (dict(prompt=[1, 99]), "prompt", "invalid_value", "outside the model's vocabulary"),
    (dict(prompt=[1], max_new_tokens=0), "max_new_tokens", "invalid_value", "must be > 0"),
    (dict(prompt=[1] * 60, max_new_tokens=10), "prompt", "context_length", "exceeds the model's context of 64"),
    (dict(prompt=[1] * 30, max_new_tokens=30), "max_new_tokens", "kv_capacity", "needs 4 KV blocks of 16"),
    (dict(prompt=[1], stop_strings=["x"]), "stop_strings", "invalid_value", "need a tokenizer"),
    (dict(prompt="text"), "prompt", "invalid_value", "no tokenizer"),
    (dict(prompt=[1], truncate="right"), "truncate", "invalid_value", "truncate='right'"),
])
def test_check_names_the_field_and_the_fix(request_kw, field, code, match):
    engine = Engine(lively(), EngineConfig(kv_blocks=3))
    request = Request(**{"max_new_tokens": 4, **request_kw})
    with pytest.raises(RequestError, match=match) as e:
        engine.check(request)
    assert (e.value.field, e.value.code) == (field, code)
    with pytest.raises(RequestError):
        engine.add(request)
    assert not engine.has_work and engine.stats()["kv_blocks_used"] == 0


def test_check_returns_the_prompt_it_would_run():
    engine = Engine(lively(vocab_size=256), EngineConfig(), ByteTokenizer())
    assert engine.check(Request("hi", 4)) == [104, 105]
    assert engine.check(Request(list(range(1, 31)) * 2, 10, truncate="left")) == (list(range(1, 31)) * 2)[6:]
    speculative = Engine(lively(), EngineConfig(), proposer=LookupProposer(2))
    with pytest.raises(RequestError, match="repetition penalty"):
        speculative.check(Request([1, 2], 4, SamplingParams(repetition_penalty=1.2)))


@pytest.mark.parametrize("kw,paged", [(dict(), True), (dict(kernel="sliding"), False), (dict(family="gru"), False),
                                      (dict(family="ssm"), False)])
def test_the_engine_decides_paged_or_contiguous_and_sizes_the_pool(kw, paged):
    model = lively(**kw)  # max_seq_len 64
    st = Engine(model, EngineConfig(max_batch=3, block_size=8)).stats()
    assert st["paged"] is paged and st["max_len"] == 64 and st["max_batch"] == 3
    if paged:  # max_batch full contexts: every sequence of a full batch can reach max_len
        assert st["kv_blocks_total"] == 3 * math.ceil(64 / 8) and st["kv_block_size"] == 8
        assert Engine(model, EngineConfig(kv_blocks=5)).stats()["kv_blocks_total"] == 5
        assert Engine(model, EngineConfig(paged=False)).stats()["paged"] is False
    else:
        assert not any(k.startswith("kv_") for k in st)
        with pytest.raises(ConfigError, match="cannot be shared by block"):
            Engine(model, EngineConfig(paged=True))


def test_engine_config_checks_its_fields():
    for bad in (dict(max_batch=0), dict(block_size=0), dict(kv_blocks=0), dict(prefill_chunk=0), dict(max_len=-1)):
        with pytest.raises(ConfigError, match=f"EngineConfig.{next(iter(bad))}="):
            EngineConfig(**bad)


def test_a_kept_state_is_reused_only_under_the_same_salt():
    """States that cannot be shared by block are kept whole after a request; the next prompt that extends them
    takes them, but only under the same cache_salt (a tenant's prompts stay its own)."""
    model = lively(family="gru")
    engine = Engine(model, EngineConfig())
    first = [5, 6, 7, 8, 9]
    out = drain_one(engine, Request(first, 4, cache_salt="a"))[-1].result
    follow = first + out.tokens + [3]
    other = drain_one(engine, Request(follow, 4, cache_salt="b"))[-1].result
    assert other.cached_tokens == 0
    again = drain_one(engine, Request(follow + other.tokens + [2], 4, cache_salt="b"))[-1].result
    assert again.cached_tokens == len(follow) + 3
    assert again.tokens == generate(model, follow + other.tokens + [2], 4).tokens


def drain_one(engine, request) -> list:
    rid = engine.add(request)
    return of(drain(engine), rid)


def test_stream_runs_one_request_on_an_idle_engine():
    engine = Engine(lively(), EngineConfig(max_batch=2))
    engine.add(Request([1, 2], 3))
    with pytest.raises(AttnlabError, match="idle engine"):
        next(engine.stream([3, 4], 3))
    drain(engine)
    stream = engine.stream([3, 4], 30)
    first = next(stream)
    stream.close()  # a consumer that stops early: its request is aborted, its rows freed
    assert first.state == RUNNING and engine.stats()["running"] == 0
    assert [e.state for e in engine.step()] == [CANCELLED]
    assert engine.generate([3, 4], 3).tokens == generate(engine.model, [3, 4], 3).tokens


def test_a_step_that_fails_outside_a_forward_still_ends_every_request(monkeypatch):
    """A bug after the scheduler's step produced its events (a request finished in it) must not lose that request:
    with raise_faults=False every live request gets a last event and nothing stays registered."""
    engine = Engine(lively(), EngineConfig(max_batch=2, raise_faults=False))
    short, long_ = engine.add(Request([1, 2, 3], 1)), engine.add(Request([4, 5, 6], 8))
    real = engine.scheduler.step

    def step_then_fail(*a, **kw):
        real(*a, **kw)  # the short request finishes here; its event is lost with the exception
        raise RuntimeError("a bug outside any forward")

    monkeypatch.setattr(engine.scheduler, "step", step_then_fail)
    events = engine.step()
    assert {e.id for e in events if e.done} == {short, long_} and not engine._live
    last = {e.id: e for e in events if e.done}
    assert last[short].state == FINISHED and last[short].result.tokens  # it did finish: its own end, not an error
    assert last[long_].state == FAILED and last[long_].error
    monkeypatch.setattr(engine.scheduler, "step", real)
    rid = engine.add(Request([1, 2, 3], 4))
    assert [e.state for e in drain(engine) if e.id == rid][-1] == FINISHED  # the engine goes on


def test_a_refused_seed_leaves_nothing_behind():
    engine = Engine(lively(), EngineConfig(max_batch=1))
    with pytest.raises(RequestError, match="seed"):
        engine.add(Request([1, 2, 3], 4, SamplingParams(temperature=1.0, seed=2 ** 70)))
    assert not engine._live and not engine.has_work
    rid = engine.add(Request([1, 2, 3], 4))
    assert of(drain(engine), rid)[-1].state == FINISHED


def test_truncate_left_fits_the_engines_max_len():
    engine = Engine(lively(), EngineConfig(max_len=32))
    prompt = [i % 30 + 1 for i in range(40)]
    assert engine.check(Request(prompt, 8, truncate="left")) == prompt[16:]  # 24 prompt tokens + 8 new = max_len 32
    with pytest.raises(RequestError, match="the engine.s max_len of 32"):
        engine.check(Request(prompt, 8))


def test_a_stop_found_only_in_released_text_finishes_with_stop():
    """The last token leaves an incomplete character held back; released at the end it completes a stop string, so
    the request ends with "stop", not "length"."""
    from attnlab.engine.detok import TextStream
    from attnlab.engine.request import Sequence
    seq = Sequence([65], 1, detok=TextStream(ByteTokenizer(), ["\ufffd"]))
    event = seq.append(0xC3, -0.1, 0.0)  # the first byte of a two-byte character, and the last token allowed
    assert event.done and event.finish_reason == "stop" and event.result.text == ""

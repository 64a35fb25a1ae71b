"""One request's fault never hurts another's: faults injected at each stage of the engine's step (admit, prefill
chunk, decode, sample, emit, cancel, preempt, resume) end only the requests they belong to, each with a last
``failed`` event, and afterwards the engine is clean (no request in any queue, every KV block free) and the next
request's output is correct."""
import math

import pytest
import torch

from attnlab.data.tokenizers import ByteTokenizer
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.generate import generate
from attnlab.engine.request import FAILED, FINISHED, Request
from attnlab.engine.sampling import SamplingParams
from attnlab.models import build_model
from conftest import tiny


class Boom(RuntimeError):
    pass


class Faulty(torch.nn.Module):
    """The model, with a fault injected into the forwards that ``when(tokens, state, n)`` picks (n: the call's
    index, counted from 0)."""

    def __init__(self, model, when):
        super().__init__()
        self.inner, self.when, self.calls = model, when, 0
        self.cfg = model.cfg

    def forward(self, tokens, state=None, **kw):
        n, self.calls = self.calls, self.calls + 1
        if self.when(tokens, state, n):
            raise Boom(f"injected fault in forward {n}")
        return self.inner(tokens, state, **kw)

    def new_state(self, *a, **kw):
        return self.inner.new_state(*a, **kw)

    def new_pool(self, *a, **kw):
        return self.inner.new_pool(*a, **kw)


def _model():
    torch.manual_seed(0)
    return build_model(tiny(max_seq_len=128)).eval()


def lively():
    """A random model whose greedy output is not just 'repeat the last token' (untied, larger init)."""
    torch.manual_seed(0)
    return build_model(tiny(max_seq_len=128, tie_embeddings=False, init_std=0.2)).eval()


def _drain(engine, limit=500):
    events = []
    for _ in range(limit):
        if not engine.has_work:
            return events
        events += engine.step()
    raise AssertionError("the engine did not drain")


def _last(events, rid):
    """A request's last event: the only one that is not running."""
    ends = [e for e in events if e.id == rid and e.done]
    assert len(ends) == 1, ends
    return ends[0]


def _clean(engine, model):
    """No request left anywhere, every block free, and a fresh request comes out as it does alone."""
    st = engine.stats()
    assert st["waiting"] == st["prefilling"] == st["running"] == 0
    assert engine.scheduler.state.batch_size == 0 and engine.scheduler.prefill_state.batch_size == 0
    if st["paged"]:
        assert st["kv_blocks_used"] == 0, "a KV block is still held"
    rid = engine.add(Request([5, 6, 7, 8, 9], 6))
    assert _last(_drain(engine), rid).result.tokens == generate(model, [5, 6, 7, 8, 9], 6).tokens


def _engine(model, pool_blocks=64, raise_faults=False, tokenizer=None, **kw):
    return Engine(model, EngineConfig(max_batch=8, paged=True, kv_blocks=pool_blocks, block_size=4,
                                      raise_faults=raise_faults, **kw), tokenizer)


@pytest.mark.parametrize("stage", ["prefill", "decode"])
def test_a_failed_forward_ends_only_its_sequences_and_leaves_nothing_behind(stage):
    model = _model()
    fail_at = {"prefill": lambda t, s, n: n == 0, "decode": lambda t, s, n: t.shape[1] == 1 and n == 3}[stage]
    faulty = Faulty(model, fail_at)
    engine = _engine(faulty)
    ids = [engine.add(Request(list(range(i, i + 9)), 8)) for i in (1, 2, 3)]
    events = _drain(engine)
    for rid in ids:
        last = _last(events, rid)
        assert last.state == FAILED and last.finish_reason == "error" and "step failed" in last.error
    st = engine.stats()
    assert st["step_errors"] == 1 and "Boom" in st["last_error"]
    _clean(engine, model)


def test_a_chunked_prefill_that_fails_midway_frees_the_blocks_it_took():
    model = _model()
    faulty = Faulty(model, lambda t, s, n: n == 2)  # the third chunk of a 40-token prompt
    engine = _engine(faulty, prefill_chunk=8)
    rid = engine.add(Request([1 + i % 30 for i in range(40)], 4))
    last = _last(_drain(engine), rid)
    assert last.state == FAILED and last.token is None and last.result.tokens == []
    _clean(engine, model)


def test_a_sampling_fault_ends_that_sequence_alone():
    """An extreme repetition penalty turns one sequence's logits non-finite; the greedy sequence beside it in the
    same batch finishes exactly as it would alone."""
    model = _model()
    engine = _engine(model)
    hostile = engine.add(Request([1, 2, 3, 4, 5, 6], 8, SamplingParams(temperature=1.0, repetition_penalty=1e-300)))
    good = engine.add(Request([7, 8, 9, 10], 8))
    events = _drain(engine)
    bad = _last(events, hostile)
    assert bad.state == FAILED and "non-finite" in bad.error
    ok = _last(events, good)
    assert ok.state == FINISHED and ok.finish_reason == "length"
    assert ok.result.tokens == generate(model, [7, 8, 9, 10], 8).tokens
    st = engine.stats()
    assert st["sequence_errors"] == 1 and st["step_errors"] == 0
    _clean(engine, model)


def test_non_finite_logits_in_one_row_end_that_row_only():
    model = _model()

    class NaNRow(Faulty):
        def forward(self, tokens, state=None, **kw):
            logits, st = self.inner(tokens, state, **kw)
            if tokens.shape[1] == 1 and tokens.shape[0] == 2:  # decode of both: poison the first row
                logits = logits.clone()
                logits[0] = math.nan
            return logits, st

    engine = _engine(NaNRow(model, None))
    a = engine.add(Request([1, 2, 3, 4], 5))
    b = engine.add(Request([9, 8, 7, 6], 5))
    events = _drain(engine)
    assert _last(events, a).state == FAILED and "non-finite" in _last(events, a).error
    assert _last(events, a).result.tokens == generate(model, [1, 2, 3, 4], 1).tokens  # the prefill's token stands
    assert _last(events, b).finish_reason == "length"
    assert _last(events, b).result.tokens[0] == generate(model, [9, 8, 7, 6], 1).tokens[0]
    _clean(engine, model)


def test_a_stop_matcher_that_raises_ends_that_sequence_alone():
    """Text and stops are matched as each token is appended; a fault there (here the tokenizer's, on one token
    only the first request produces) ends that request alone."""
    model = lively()
    bad_alone, good_alone = generate(model, [1, 2, 3], 8).tokens, generate(model, [4, 5, 6], 8).tokens
    poison = next(t for t in bad_alone if t not in good_alone)
    poisoned = {poison}

    class Poisoned(ByteTokenizer):
        def decode_text(self, ids):
            if poisoned & set(ids):
                raise ValueError("a broken decoder")
            return super().decode_text(ids)

    engine = _engine(model, tokenizer=Poisoned())
    bad = engine.add(Request([1, 2, 3], 8, stop_strings=["never"]))
    good = engine.add(Request([4, 5, 6], 8))
    events = _drain(engine)
    last = _last(events, bad)
    assert last.state == FAILED and last.result.tokens == bad_alone[:bad_alone.index(poison) + 1]
    assert _last(events, good).result.tokens == good_alone
    poisoned.clear()
    _clean(engine, model)


def test_a_sequence_that_cannot_be_admitted_ends_alone(monkeypatch):
    from attnlab.models.paged import PagedKVCache

    model = _model()
    engine = _engine(model)
    original = PagedKVCache.add_sequence

    def add(self, prompt=None, salt=""):
        row = original(self, prompt, salt)
        if salt == "poison":  # a row begun, then the fault: the scheduler must give it back
            raise Boom("injected fault while admitting")
        return row

    monkeypatch.setattr(PagedKVCache, "add_sequence", add)
    bad = engine.add(Request(list(range(1, 12)), 4, cache_salt="poison"))
    good = engine.add(Request([4, 5, 6], 4))
    events = _drain(engine)
    assert _last(events, bad).state == FAILED
    assert _last(events, good).result.tokens == generate(model, [4, 5, 6], 4).tokens
    _clean(engine, model)


def test_cancel_takes_a_finished_sequence_out_of_its_queue():
    """A sequence that finished in a step that then failed was left in the running batch, and every later step
    failed on it; the scheduler's cancel now removes it whatever its finish reason."""
    model = _model()
    engine = _engine(model)
    engine.add(Request([1, 2, 3], 20))
    engine.step()
    sched = engine.scheduler
    seq = sched.running[0]
    seq.finish_reason = "length"  # finished, but never retired
    assert sched.cancel(seq) and seq not in sched.running and seq.finish_reason == "length"
    engine.abort(seq.id)  # the engine still counts it: its last event is the finish it had
    assert [(e.id, e.state) for e in engine.step()] == [(seq.id, FINISHED)]
    _clean(engine, model)


def test_faults_during_preemption_and_resume_leave_the_pool_whole():
    """A pool too small for all five sequences preempts and recomputes; a fault in a resumed sequence's prefill
    ends the sequences of that forward, the rest finish as they would alone, and every block comes back."""
    model = _model()
    prompts = [list(range(i, i + 14)) for i in range(1, 6)]
    alone = {tuple(p): generate(model, p, 20).tokens for p in prompts}
    resumed = {"seen": False}

    def when(tokens, state, n):  # the first prefill of a sequence that was preempted
        if resumed["seen"]:
            return False
        hit = tokens.shape[1] > 1 and any(s.preemptions for s in engine.scheduler.prefilling)
        resumed["seen"] = hit
        return hit

    faulty = Faulty(model, when)
    engine = _engine(faulty, pool_blocks=14)
    ids = {engine.add(Request(p, 20)): p for p in prompts}
    events = _drain(engine)
    assert resumed["seen"] and engine.stats()["preemptions"] > 0
    results = {rid: _last(events, rid).result for rid in ids}
    failed = [r for r in results.values() if r.finish_reason == "error"]
    assert failed and all(r.preemptions for r in failed)
    for rid, r in results.items():
        if r.finish_reason != "error":
            assert r.tokens == alone[tuple(ids[rid])]
        assert r.cached_tokens <= r.prompt_tokens
    _clean(engine, model)


def test_a_library_call_still_raises_after_cleaning_up():
    """generate() and friends keep raising on a failed forward (raise_faults=True), with the engine clean after."""
    model = _model()
    faulty = Faulty(model, lambda t, s, n: n == 1)
    engine = _engine(faulty, pool_blocks=32, raise_faults=True)
    engine.add(Request([1, 2, 3], 5))
    with pytest.raises(Boom):
        _drain(engine)
    faulty.when = lambda t, s, n: False
    _clean(engine, model)

"""One request's fault never hurts another's: faults injected at each stage of the scheduler (admit, prefill
chunk, decode, sample, emit, cancel, preempt, resume) end only the sequences they belong to, and afterwards the
engine is clean (no sequence in any queue, every KV block free) and the next request's output is correct."""
import math

import pytest
import torch

from attnlab.engine.generate import generate
from attnlab.engine.sampling import SamplingParams
from attnlab.engine.scheduler import Scheduler, Sequence
from attnlab.engine.stops import StopChecker
from conftest import tiny
from attnlab.models import build_model


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


def _drain(sched, limit=500):
    events = []
    for _ in range(limit):
        if not sched.has_work:
            return events
        events += sched.step()
    raise AssertionError("the scheduler did not drain")


def _clean(sched, model):
    """No sequence left anywhere, every block free, and a fresh request comes out as it does alone."""
    assert not sched.waiting and not sched.prefilling and not sched.running
    assert sched.state.batch_size == 0 and sched.prefill_state.batch_size == 0
    if sched.pool is not None:
        assert all(r == 0 for r in sched.pool.ref), "a KV block is still held"
    seq = sched.submit(Sequence([5, 6, 7, 8, 9], 6))
    _drain(sched)
    assert seq.tokens == generate(model, [5, 6, 7, 8, 9], 6).tokens


def _sched(model, pool_blocks=64, **kw):
    return Scheduler(model, pool=model.new_pool(n_blocks=pool_blocks, block_size=4), raise_faults=False, **kw)


@pytest.mark.parametrize("stage", ["prefill", "decode"])
def test_a_failed_forward_ends_only_its_sequences_and_leaves_nothing_behind(stage):
    model = _model()
    fail_at = {"prefill": lambda t, s, n: n == 0, "decode": lambda t, s, n: t.shape[1] == 1 and n == 3}[stage]
    faulty = Faulty(model, fail_at)
    sched = _sched(faulty)
    seqs = [sched.submit(Sequence(list(range(i, i + 9)), 8)) for i in (1, 2, 3)]
    _drain(sched)
    assert all(s.finish_reason == "error" and "step failed" in s.error for s in seqs)
    assert sched.step_errors == 1 and "Boom" in sched.last_error
    _clean(sched, model)


def test_a_chunked_prefill_that_fails_midway_frees_the_blocks_it_took():
    model = _model()
    faulty = Faulty(model, lambda t, s, n: n == 2)  # the third chunk of a 40-token prompt
    sched = _sched(faulty, prefill_chunk=8)
    seq = sched.submit(Sequence(list(range(1, 41)), 4))
    _drain(sched)
    assert seq.finish_reason == "error" and seq.tokens == []
    _clean(sched, model)


def test_a_sampling_fault_ends_that_sequence_alone():
    """An extreme repetition penalty turns one sequence's logits non-finite; the greedy sequence beside it in the
    same batch finishes exactly as it would alone."""
    model = _model()
    sched = _sched(model)
    hostile = sched.submit(Sequence([1, 2, 3, 4, 5, 6], 8, SamplingParams(temperature=1.0, repetition_penalty=1e-300)))
    good = sched.submit(Sequence([7, 8, 9, 10], 8))
    events = _drain(sched)
    assert hostile.finish_reason == "error" and "non-finite" in hostile.error
    assert good.finish_reason == "length" and good.tokens == generate(model, [7, 8, 9, 10], 8).tokens
    assert [e for e in events if e.seq is hostile][-1].finished
    assert sched.seq_errors == 1 and sched.step_errors == 0
    _clean(sched, model)


def test_non_finite_logits_in_one_row_end_that_row_only():
    model = _model()

    class NaNRow(Faulty):
        def forward(self, tokens, state=None, **kw):
            logits, st = self.inner(tokens, state, **kw)
            if tokens.shape[1] == 1 and tokens.shape[0] == 2:  # decode of both: poison the first row
                logits = logits.clone()
                logits[0] = math.nan
            return logits, st

    sched = _sched(NaNRow(model, None))
    a = sched.submit(Sequence([1, 2, 3, 4], 5))
    b = sched.submit(Sequence([9, 8, 7, 6], 5))
    _drain(sched)
    assert a.finish_reason == "error" and "non-finite" in a.error
    assert b.finish_reason == "length" and b.tokens[0] == generate(model, [9, 8, 7, 6], 1).tokens[0]
    _clean(sched, model)


def test_a_stop_checker_that_raises_ends_that_sequence_alone():
    model = _model()

    class Broken(StopChecker):
        def done(self, tokens):
            if len(tokens) == 3:
                raise ValueError("a broken stop matcher")
            return False

    sched = _sched(model)
    bad = sched.submit(Sequence([1, 2, 3], 8, stopper=Broken([], [], None)))
    good = sched.submit(Sequence([4, 5, 6], 8))
    _drain(sched)
    assert bad.finish_reason == "error" and len(bad.tokens) == 3
    assert good.tokens == generate(model, [4, 5, 6], 8).tokens
    _clean(sched, model)


def test_a_sequence_that_cannot_be_admitted_ends_alone(monkeypatch):
    from attnlab.models.paged import PagedKVCache

    model = _model()
    sched = _sched(model)
    original = PagedKVCache.add_sequence

    def add(self, prompt=None, salt=""):
        row = original(self, prompt, salt)
        if salt == "poison":  # a row begun, then the fault: the scheduler must give it back
            raise Boom("injected fault while admitting")
        return row

    monkeypatch.setattr(PagedKVCache, "add_sequence", add)
    bad = sched.submit(Sequence(list(range(1, 12)), 4, cache_salt="poison"))
    good = sched.submit(Sequence([4, 5, 6], 4))
    events = _drain(sched)
    assert bad.finish_reason == "error" and any(e.seq is bad and e.finished for e in events)
    assert good.tokens == generate(model, [4, 5, 6], 4).tokens
    _clean(sched, model)


def test_cancel_takes_a_finished_sequence_out_of_its_queue():
    """A sequence that finished in a step that then failed was left in the running batch, and every later step
    failed on it; cancel now removes it whatever its finish reason."""
    model = _model()
    sched = _sched(model)
    seq = sched.submit(Sequence([1, 2, 3], 20))
    sched.step()
    assert seq in sched.running
    seq.finish_reason = "length"  # finished, but never retired
    assert sched.cancel(seq) and seq not in sched.running and seq.finish_reason == "length"
    _clean(sched, model)


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
        hit = tokens.shape[1] > 1 and any(s.preemptions for s in seqs if s in sched.prefilling)
        resumed["seen"] = hit
        return hit

    faulty = Faulty(model, when)
    sched = _sched(faulty, pool_blocks=14)
    seqs = [sched.submit(Sequence(p, 20)) for p in prompts]
    _drain(sched)
    assert resumed["seen"] and sched.preemptions > 0
    failed = [s for s in seqs if s.finish_reason == "error"]
    assert failed and all(s.preemptions for s in failed)
    for s in seqs:
        if s.finish_reason != "error":
            assert s.tokens == alone[tuple(s.prompt)]
        assert s.cached_tokens <= len(s.prompt)
    _clean(sched, model)


def test_a_library_call_still_raises_after_cleaning_up():
    """generate() and friends keep raising on a failed forward (raise_faults=True), with the engine clean after."""
    model = _model()
    faulty = Faulty(model, lambda t, s, n: n == 1)
    sched = Scheduler(faulty, pool=model.new_pool(n_blocks=32, block_size=4))
    sched.submit(Sequence([1, 2, 3], 5))
    with pytest.raises(Boom):
        _drain(sched)
    faulty.when = lambda t, s, n: False
    _clean(sched, model)

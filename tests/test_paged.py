"""The paged KV cache: equals the contiguous cache, frees and reuses blocks, shares prefixes by block with
copy on divergence and copy on write; and the engine's one step over it."""
import pytest
import torch

from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.generate import generate
from attnlab.engine.request import CANCELLED, Request, RequestError, Sequence
from attnlab.engine.sampling import SamplingParams
from attnlab.models import build_model
from attnlab.models.block_pool import OutOfBlocks
from conftest import tiny


def _model(**kw):
    torch.manual_seed(0)
    return build_model(tiny(max_seq_len=128, **kw)).eval()


@pytest.mark.parametrize("kernel", ["sdpa", "flash", "naive"])
def test_paged_equals_contiguous_cache(kernel):
    model = _model(kernel=kernel, n_kv_heads=2)
    prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 0, -1))]
    a = generate(model, prompts, 12)
    b = generate(model, prompts, 12, paged=True)
    assert [c.tokens for c in a.completions] == [c.tokens for c in b.completions]
    for x, y in zip(a.completions, b.completions):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


def _advance(state, row, n, model):
    """Advance one row of a paged batch by n tokens while the others wait (a sub-batch of one row)."""
    sub = state.take([row])
    model(torch.randint(0, 37, (1, n)), sub)
    rest = state.take(list(range(row, state.batch_size)))
    state.extend(sub)
    state.extend(rest)


def test_blocks_are_freed_and_reused_with_no_per_sequence_preallocation():
    model = _model()
    pool = model.new_pool(n_blocks=10, block_size=4)
    state = model.new_state(0, pool=pool)
    with torch.no_grad():
        for n in (9, 3, 6):
            _advance(state, state.add_sequence(), n, model)
    # 9, 3 and 6 tokens hold ceil(n / 4) = 3 + 1 + 2 blocks, no more
    assert state.pos.tolist() == [9, 3, 6]
    assert pool.used_blocks == 6 and state.nbytes == 6 * pool.bytes_per_block
    first = list(state.tables[0])
    state.release(0)
    assert pool.used_blocks == 3 and pool.free_blocks == 7
    with torch.no_grad():  # 28 tokens need all 7 free blocks: the freed ones come back
        _advance(state, state.add_sequence(), 28, model)
    assert set(first) <= set(state.tables[-1]) and pool.free_blocks == 0


def test_prefix_blocks_are_shared_and_skip_prefill():
    model = _model()
    engine = _paged(model, kv_blocks=64, block_size=4)
    prefix = list(range(1, 23))  # 22 tokens: 5 full blocks and 2 more
    first = engine.add(Request(prefix + [30, 31], 3))
    assert _drain(engine)[first].cached_tokens == 0
    ids = [engine.add(Request(prefix + [32 + i, 33], 3)) for i in range(4)]
    events = engine.step()  # admitted and prefilled together
    # 5 full blocks are shared by reference; the block holding tokens 20..23 is copied where they diverge.
    assert {e.id for e in events} == set(ids) and all(e.cached_tokens == 22 for e in events)
    tables, pool = engine.scheduler.state.tables, engine.scheduler.pool
    shared = set(tables[0][:5])
    assert all(set(t[:5]) == shared for t in tables)
    assert all(pool.ref[b] == 4 for b in shared)
    assert len({t[5] for t in tables}) == 4  # each diverging block is its own copy
    results = _drain(engine)
    alone = [generate(model, prefix + [32 + i, 33], 3).tokens for i in range(4)]
    assert [results[i].tokens for i in ids] == alone


def test_the_prefix_cache_is_shared_only_under_the_same_salt():
    """A tenant's cached prompt is invisible to another salt: no block shared, nothing reported as cached; the same
    salt shares it. Outputs are unchanged either way."""
    model = _model()
    engine = _paged(model, kv_blocks=64, block_size=4)
    prompt = list(range(1, 23))
    first = engine.add(Request(prompt, 3, cache_salt="tenant-a"))
    results = _drain(engine)
    ids = [engine.add(Request(prompt, 3, cache_salt=salt)) for salt in ("tenant-b", "tenant-a", "")]
    results.update(_drain(engine))
    assert [results[i].cached_tokens for i in ids] == [0, 21, 0]
    assert all(results[i].tokens == generate(model, prompt, 3).tokens for i in [first, *ids])


def test_block_keys_chain_cryptographically_and_a_match_checks_the_parent():
    from attnlab.models.block_pool import block_key, root_key

    a, b = root_key("x"), root_key("y")
    assert a != b and len(a) == 16 and root_key("") == root_key()
    k = block_key(a, (1, 2, 3, 4))
    assert k != block_key(b, (1, 2, 3, 4)) and k != block_key(a, (1, 2, 3, 5)) and k == block_key(a, (1, 2, 3, 4))
    pool = _model().new_pool(n_blocks=4, block_size=4)
    blk = pool.allocate()
    pool.register(blk, k, (1, 2, 3, 4), a)
    assert pool.find(k, (1, 2, 3, 4), a) == blk
    assert pool.find(k, (1, 2, 3, 4), b) is None  # the same key under another parent is no match
    assert pool.find(k, (1, 2, 3, 5), a) is None


def test_copy_on_write_keeps_the_other_sequence_intact():
    model = _model()
    pool = model.new_pool(n_blocks=32, block_size=4)
    state = model.new_state(0, pool=pool)
    text = list(range(1, 13))
    with torch.no_grad():
        state.add_sequence()
        model(torch.tensor([text]), state)
        state.add_sequence(text + [20])  # takes the 3 full blocks of the first
        assert state.pos.tolist() == [12, 12] and state.tables[1] == state.tables[0]
        state.rollback([12, 6])  # the second forgets into a shared block, then writes into it
        out, _ = model(torch.tensor([[1], [30]]), state)
        assert state.tables[1][1] != state.tables[0][1]  # it wrote into its own copy
        ref0, _ = model(torch.tensor([text + [1]]))
        ref1, _ = model(torch.tensor([text[:6] + [30]]))
    torch.testing.assert_close(out[0, 0], ref0[0, -1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out[1, 0], ref1[0, -1], atol=1e-5, rtol=1e-4)


def _paged(model, **kw):
    return Engine(model, EngineConfig(max_batch=8, paged=True, **kw))


def _drain(engine) -> dict:
    """Step until done; each request's result by id."""
    results = {}
    while engine.has_work:
        results.update((e.id, e.result) for e in engine.step() if e.done)
    return results


def test_the_engine_preempts_and_recomputes_when_blocks_run_out():
    model = _model()
    prompts = [list(range(i, i + 14)) for i in range(1, 6)]
    alone = [generate(model, p, 20).tokens for p in prompts]
    engine = _paged(model, kv_blocks=14, block_size=4)  # 5 sequences of 34 tokens need 45 blocks
    ids = [engine.add(Request(p, 20)) for p in prompts]
    results = _drain(engine)
    assert [results[i].tokens for i in ids] == alone
    assert sum(results[i].preemptions for i in ids) > 0 and engine.stats()["preemptions"] > 0
    assert engine.stats()["kv_blocks_used"] == 0


def test_one_sequence_too_long_for_the_pool_is_a_clear_error():
    model = _model()
    engine = _paged(model, kv_blocks=2, block_size=4)
    with pytest.raises(RequestError, match="needs 6 KV blocks of 4 tokens .* the pool holds 2") as e:
        engine.add(Request(list(range(1, 20)), 4))
    assert e.value.code == "kv_capacity" and not engine.has_work
    engine.scheduler.submit(Sequence(list(range(1, 20)), 4))  # past the check, the step itself still refuses it
    with pytest.raises(OutOfBlocks, match="allocate more blocks"):
        engine.scheduler.step()


def test_abort_frees_blocks_at_once():
    model = _model()
    engine = _paged(model, kv_blocks=40, block_size=4)
    a = engine.add(Request(list(range(1, 30)), 50))
    b = engine.add(Request(list(range(2, 9)), 50))
    engine.step()
    engine.step()
    assert engine.stats()["kv_blocks_used"] > 0
    engine.abort(a)
    engine.abort(b)
    assert engine.stats()["kv_blocks_used"] == 0 and engine.stats()["running"] == 0
    ends = engine.step()  # the aborted requests' last events, and nothing else to do
    assert [(e.id, e.state, e.finish_reason) for e in ends] == [(a, CANCELLED, "cancelled"),
                                                                 (b, CANCELLED, "cancelled")]
    assert not engine.has_work


def test_sequences_join_and_leave_a_running_batch_with_outputs_unchanged():
    """Continuous batching: requests of different lengths arriving at different steps, sampled and greedy."""
    model = _model()
    engine = _paged(model, prefill_chunk=5)
    params = [SamplingParams(), SamplingParams(temperature=0.9, top_k=10, seed=3)]
    specs = [(list(range(1, 4 + 3 * i)), 6 + i, params[i % 2]) for i in range(6)]
    ids, results = [], {}
    for p, n, sp in specs:
        ids.append(engine.add(Request(p, n, sp)))
        results.update((e.id, e.result) for e in engine.step() if e.done)  # one joins per step
    results.update(_drain(engine))
    for rid, (p, n, sp) in zip(ids, specs):
        assert results[rid].tokens == generate(model, p, n, sp).tokens


def test_a_request_that_does_not_fit_leaves_the_engine_usable():
    """A request the pool cannot hold is refused before it takes a row or a block; the next one runs."""
    model = _model()
    engine = Engine(model, EngineConfig(kv_blocks=2, block_size=4))
    engine.generate(list(range(1, 8)), 1)
    with pytest.raises(RequestError, match="KV blocks"):
        engine.generate([1, 2, 3, 4, 5, 6, 9, 9, 9, 9], 1)
    assert engine.generate([3, 3], 1).tokens == generate(model, [3, 3], 1).tokens
    assert engine.stats()["kv_blocks_used"] == 0


def test_growing_in_place_never_evicts_a_cached_prefix():
    model = _model()
    pool = model.new_pool(n_blocks=12, block_size=4)
    state = model.new_state(0, pool=pool)
    with torch.no_grad():
        for n in (8, 8):
            _advance(state, state.add_sequence(), n, model)
        cached = [b for t in state.tables for b in t]
        state.release(1)
        state.release(0)  # both prefixes now sit in the pool, keyed and free
        _advance(state, state.add_sequence(), 30, model)  # 8 blocks: fits in the 8 free blocks without keys
    assert not set(cached) & set(state.tables[0])
    assert all(pool.key[b] is not None for b in cached)


def test_a_pool_full_of_cached_prefixes_still_gives_a_sequence_a_run_of_blocks():
    """Once every free block holds a cached prefix (a long-lived server), a new sequence takes a run of them, read
    as a view, not the oldest blocks scattered over the pool, which would be gathered block by block at every
    layer of every step; its outputs are those of the contiguous cache."""
    from attnlab.models.block_pool import block_key, root_key

    model = _model()
    pool = model.new_pool(n_blocks=12, block_size=4)
    blocks = [pool.allocate() for _ in range(12)]
    for b in blocks:
        pool.register(b, block_key(root_key(), (100 + b,) * 4), (100 + b,) * 4, root_key())
    for b in (5, 0, 9, 2, 7, 11, 3, 8, 1, 10, 4, 6):  # freed in scattered order: oldest-first is scattered
        pool.decref(b)
    assert pool.free_blocks == 12 and not pool._in_heap
    prompt = list(range(3, 13))  # 10 tokens: 3 blocks
    state = model.new_state(0, pool=pool)
    row = state.add_sequence(prompt)
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), state)[0]
        for t in (7, 8, 9):  # grow by one token at a time into a fourth block
            logits = torch.cat([logits, model(torch.tensor([[t]]), state)[0]], 1)
    table = state.tables[row]
    assert len(table) == 4 and table == list(range(table[0], table[0] + 4)), table
    assert isinstance(state._plan[2][0], int)  # the last forward read the row as a view
    with torch.no_grad():
        ref = model(torch.tensor([prompt + [7, 8, 9]]))[0]
    assert torch.allclose(logits, ref, atol=1e-5)


def test_a_prefill_budget_spreads_a_burst_of_prompts_over_steps_with_outputs_unchanged():
    """--prefill-budget: a step feeds at most the budget's prompt tokens in all (each prompt being prefilled
    at least one), first come first served; the outputs are those of each prompt alone."""
    model = _model()
    engine = _paged(model, prefill_chunk=6, prefill_budget=8)
    prompts = [list(range(1 + i, 11 + i)) for i in range(4)]  # 40 prompt tokens arriving together
    ids = [engine.add(Request(p, 5)) for p in prompts]
    seqs = list(engine.scheduler.waiting)  # the engine's own records, to watch their prefill progress
    fed_per_step, results = [], {}
    while engine.has_work:
        before = sum(s.fed for s in seqs)
        results.update((e.id, e.result) for e in engine.step() if e.done)
        fed_per_step.append(sum(s.fed for s in seqs) - before)
    # chunks of at most 6 per prompt, 8 per step: (6+2), (4+4), (4+4), (6+2), 6, 2, then decoding only
    assert fed_per_step[:7] == [8, 8, 8, 8, 6, 2, 0] and sum(fed_per_step) == 40
    for rid, p in zip(ids, prompts):
        assert results[rid].tokens == generate(model, p, 5).tokens

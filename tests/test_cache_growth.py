"""Claim 10's memory probe: the bytes a state holds, read from the allocator and from storage, follow the cache as it
grows block by block (and catch a copy), while a recurrent state's stay put."""
import torch

from attnlab.experiments.e10_kv_cache import growth, held_bytes
from attnlab.models import build_model
from conftest import tiny


def test_a_paged_cache_holds_one_more_block_every_block_size_tokens():
    torch.manual_seed(0)
    model = build_model(tiny(max_seq_len=128)).eval()
    points = growth(model, [20], 30, "cpu", paged=True)
    state = model.new_state(1, 64, paged=True)
    per_block = sum(t.untyped_storage().nbytes() for t in state.pool.k + state.pool.v) // state.pool.n_blocks
    blocks = {p["context"]: p["bytes"] // per_block for p in points}
    assert all(blocks[c] == -(-c // state.block_size) for c in blocks), blocks  # ceil(context / block): no more
    assert held_bytes(state) == 0  # an empty sequence holds nothing, however large the pool


def test_held_bytes_count_a_shared_storage_once_and_see_a_grown_one():
    torch.manual_seed(0)
    lstm = build_model(tiny(family="lstm")).eval()
    points = growth(lstm, [8, 32], 4, "cpu", paged=False)
    assert len({p["bytes"] for p in points}) == 1 and points[0]["bytes"] > 0  # the same bytes at every context
    state = lstm.new_state(1)
    before = held_bytes(state)
    name = next(iter(state.t))
    state.t["view"] = state.t[name][..., :1]  # a view shares its storage: not counted again
    assert held_bytes(state) == before
    state.t["copy"] = torch.cat([state.t[name]] * 3)  # a state that kept copies would show them
    assert held_bytes(state) > before

"""Claim 10's memory probe: the resident memory a fresh process adds follows the cache as it grows (measured, at the
formula's rate), the allocator's count of blocks in use follows it block by block (and catches a copy), while a
recurrent state's stays put."""
import pytest
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
    blocks = {p["context"]: p["counted_bytes"] // per_block for p in points}
    assert all(blocks[c] == -(-c // state.block_size) for c in blocks), blocks  # ceil(context / block): no more
    assert held_bytes(state) == 0  # an empty sequence holds nothing, however large the pool


def test_held_bytes_count_a_shared_storage_once_and_see_a_grown_one():
    torch.manual_seed(0)
    lstm = build_model(tiny(family="lstm")).eval()
    points = growth(lstm, [8, 32], 4, "cpu", paged=False)
    assert len({p["counted_bytes"] for p in points}) == 1 and points[0]["counted_bytes"] > 0  # the same at any context
    state = lstm.new_state(1)
    before = held_bytes(state)
    name = next(iter(state.t))
    state.t["view"] = state.t[name][..., :1]  # a view shares its storage: not counted again
    assert held_bytes(state) == before
    state.t["copy"] = torch.cat([state.t[name]] * 3)  # a state that kept copies would show them
    assert held_bytes(state) > before


def test_resident_memory_in_a_fresh_process_grows_at_the_formulas_rate():
    """The measurement claim 10 decides on, for real: a fresh process (large allocations mapped) decodes into a paged
    cache whose pool is backed lazily; the resident memory it adds grows at 2*L*Hkv*D*4 bytes per token, the empty
    pool takes next to nothing before it is written, and an LSTM's run adds none as its context grows."""
    from attnlab.config import preset
    from attnlab.cost.analytic import kv_bytes_per_token
    from attnlab.cost.arch import from_model_config
    from attnlab.experiments.e10_kv_cache import _line
    from attnlab.timing import resident_bytes, run_fresh

    if resident_bytes() is None:
        pytest.skip("no /proc/self/status here: resident memory cannot be read")
    # Contexts over 1,000 tokens apart: the heap's pages that come and go between readings (up to ~150 KiB) then
    # tilt the LSTM's line by tens of bytes per token, well inside the bar; 512 apart, they could tilt it past the bar.
    g = run_fresh("attnlab.experiments.e10_kv_cache", "growth_in_fresh_process",
                  [[128, 640, 1152], 48, "cpu", "default", "lstm-10m"], threads=1, what="growth")
    assert g["memory"] == "resident"
    per_tok = kv_bytes_per_token(from_model_config(preset("default")), "fp32")
    kv, rnn = g["kv"], g["lstm"]
    slope = _line([p["context"] for p in kv], [p["bytes"] for p in kv])[1]
    assert abs(slope / per_tok - 1) <= 0.2, (slope, per_tok)
    from attnlab.experiments.e10_kv_cache import HEAP_NOISE_BYTES, LAZY_SHARE
    assert all(p["unwritten_bytes"] <= LAZY_SHARE * p["state_bytes"] + HEAP_NOISE_BYTES for p in kv)  # backed lazily
    lstm_slope = _line([p["context"] for p in rnn], [p["bytes"] for p in rnn])[1]
    assert abs(lstm_slope) <= 0.05 * per_tok, lstm_slope

"""The one contract: a parallel pass over T tokens equals T single steps through the state."""
import pytest
import torch

from attnlab.errors import AttnlabError
from attnlab.models import build_model
from conftest import FAMILIES, KERNELS, POSITIONS, tiny

CASES = ([dict(family="transformer", kernel=k, pos=p) for k in KERNELS for p in POSITIONS]
         + [dict(family="transformer", n_kv_heads=2, mlp="swiglu", norm="rmsnorm"),
            dict(family="transformer", n_kv_heads=1, pos="alibi", kernel="naive")]
         + [dict(family=f, fused=fu) for f in ("rnn", "lstm", "gru") for fu in (False, True)])


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: "-".join(str(v) for v in kw.values()))
def test_one_pass_equals_single_steps(kw):
    model = build_model(tiny(**kw)).eval()
    tokens = torch.randint(0, 37, (3, 20))
    with torch.no_grad():
        full, none_state = model(tokens)
        assert none_state is None
        state = model.new_state(3, 32)
        steps = [model(tokens[:, t:t + 1], state)[0] for t in range(20)]
    assert state.pos.tolist() == [20, 20, 20]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_equals_full_pass(family):
    model = build_model(tiny(family=family)).eval()
    tokens = torch.randint(0, 37, (2, 17))
    with torch.no_grad():
        full, _ = model(tokens)
        state = model.new_state(2, 17)
        a, _ = model(tokens[:, :11], state)  # prefill
        b, _ = model(tokens[:, 11:15], state)  # a verification-sized chunk (T=4) after a prefix
        c = [model(tokens[:, t:t + 1], state)[0] for t in (15, 16)]
    torch.testing.assert_close(torch.cat([a, b, *c], dim=1), full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru"])
def test_visible_loop_equals_torch_fused_kernel(family):
    loop = build_model(tiny(family=family)).eval()
    fused = build_model(tiny(family=family, fused=True)).eval()
    fused.load_state_dict(loop.state_dict())
    tokens = torch.randint(0, 37, (2, 25))
    with torch.no_grad():
        torch.testing.assert_close(loop(tokens)[0], fused(tokens)[0], atol=1e-5, rtol=1e-4)
    # and the backward pass claim 2 times: the same gradients for every weight
    for m in (loop, fused):
        m(tokens)[0].square().mean().backward()
    for (name, a), b in zip(loop.named_parameters(), fused.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_kv_cache_bytes_and_position():
    cfg = tiny(n_kv_heads=2)
    model = build_model(cfg)
    state = model.new_state(batch_size=3, max_len=40)
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4  # K and V, fp32
    assert state.bytes_per_token == per_token
    assert state.nbytes == per_token * 40 * 3
    model(torch.randint(0, 37, (3, 7)), state)
    assert state.pos.tolist() == [7, 7, 7] and state.used_bytes == per_token * 7 * 3
    bf16 = model.new_state(1, 10, dtype=torch.bfloat16)
    assert bf16.nbytes == per_token // 2 * 10


@pytest.mark.parametrize("family", ["rnn", "lstm", "gru"])
def test_recurrent_state_is_fixed_size(family):
    model = build_model(tiny(family=family))
    small, big = model.new_state(2, 8), model.new_state(2, 100_000)
    assert small.nbytes == big.nbytes == 2 * 32 * 2 * 4 * (2 if family == "lstm" else 1)
    model(torch.randint(0, 37, (2, 5)), small)
    assert small.pos.tolist() == [5, 5]


def test_cache_overflow_is_a_clear_error():
    model = build_model(tiny())
    state = model.new_state(1, 4)
    with pytest.raises(AttnlabError, match="KV cache full.*max_len 4"):
        model(torch.randint(0, 37, (1, 5)), state)


def test_bad_tokens_shape_is_a_clear_error():
    model = build_model(tiny())
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.randint(0, 37, (5,)))

"""Beyond quadratic: every exact kernel equals naive (forward and gradients); the others equal naive under
their own masks; linear attention's two forms agree; the SSM's two scans agree."""
import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.measure.trace import trace
from attnlab.models import build_model, flash
from attnlab.models.attention import KERNELS
from attnlab.models.linear import linear_parallel, linear_recurrent, phi
from attnlab.models.positional import alibi_slopes
from attnlab.models.sparse import pairs_scored, pattern_mask
from attnlab.models.ssm import scan_parallel, scan_sequential, selective_scan


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(flash, "Q_TILE", 16)
    monkeypatch.setattr(flash, "K_TILE", 24)  # lengths below are not multiples of either tile


def _inputs(H, Hkv, T, S, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, T, D, generator=g, requires_grad=True)
    k = torch.randn(2, Hkv, S, D, generator=g, requires_grad=True)
    v = torch.randn(2, Hkv, S, D, generator=g, requires_grad=True)
    return q, k, v


def _fwd_bwd(kernel, q, k, v, **kw):
    out = KERNELS[kernel](q, k, v, **kw)
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(), (q, k, v))
    return out, grads


def _assert_same(a, b):
    (oa, ga), (ob, gb) = a, b
    torch.testing.assert_close(oa, ob, atol=2e-5, rtol=1e-4)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("T,S", [(37, 37), (50, 61), (1, 29)])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_flash_equals_naive_forward_and_gradients(small_tiles, H, Hkv, T, S, alibi, causal):
    q, k, v = _inputs(H, Hkv, T, S)
    kw = dict(causal=causal, alibi_slopes=alibi_slopes(H) if alibi else None, scale=0.3)
    _assert_same(_fwd_bwd("flash", q, k, v, **kw), _fwd_bwd("naive", q, k, v, **kw))


@pytest.mark.parametrize("kernel", ["flash", "sliding"])
@pytest.mark.parametrize("alibi", [False, True])
def test_flash_with_per_row_positions_and_key_lengths(small_tiles, kernel, alibi):
    """A ragged batch: row 0's 9 queries sit at 31..39 over 40 keys, row 1's at 5..13 over its first 14."""
    q, k, v = _inputs(4, 2, 9, 40)
    q_pos = torch.stack([torch.arange(31, 40), torch.arange(5, 14)])
    kw = dict(causal=True, alibi_slopes=alibi_slopes(4) if alibi else None, scale=0.3, q_pos=q_pos,
              kv_len=torch.tensor([40, 14]))
    extra = dict(window=6) if kernel == "sliding" else {}
    _assert_same(_fwd_bwd(kernel, q, k, v, **kw, **extra), _fwd_bwd("naive", q, k, v, **kw, **extra))


@pytest.mark.parametrize("window", [1, 5, 23, 100])
@pytest.mark.parametrize("T,S", [(45, 45), (7, 52), (1, 30)])
def test_sliding_equals_naive_with_a_banded_mask(small_tiles, window, T, S):
    q, k, v = _inputs(4, 2, T, S)
    kw = dict(causal=True, alibi_slopes=None, scale=0.3, window=window)
    _assert_same(_fwd_bwd("sliding", q, k, v, **kw), _fwd_bwd("naive", q, k, v, **kw))


@pytest.mark.parametrize("T,block", [(64, 8), (61, 8), (30, 5), (100, 10)])
def test_block_sparse_equals_naive_with_its_mask(T, block):
    q, k, v = _inputs(4, 2, T, T)
    mask = pattern_mask(T, T, None, block, "cpu")
    a = _fwd_bwd("block_sparse", q, k, v, causal=True, alibi_slopes=None, scale=0.3, block_size=block)
    b = _fwd_bwd("naive", q, k, v, causal=False, alibi_slopes=None, scale=0.3, extra_mask=mask)
    _assert_same(a, b)
    assert int(mask.sum()) == pairs_scored(T, block)


def test_block_sparse_scores_T_sqrt_T_pairs():
    import math
    for T in (1024, 4096, 16384):
        b = math.isqrt(T)
        assert pairs_scored(T, b) < 2 * T * b  # ~ T*sqrt(T), far below the causal T^2/2
    assert pairs_scored(16384, 128) / (16384 * 16385 / 2) < 0.02


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_linear_attention_parallel_equals_recurrent(chunk):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 29, 8, generator=g) for _ in range(3))
    q, k = phi(q), phi(k)
    S0, z0 = torch.rand(2, 3, 8, 8, generator=g), torch.rand(2, 3, 8, generator=g)
    a, Sa, za = linear_parallel(q, k, v, S0, z0, chunk)
    b, Sb, zb = linear_recurrent(q, k, v, S0, z0)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(Sa, Sb, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(za, zb, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("T", [1, 2, 5, 16, 33])
def test_ssm_parallel_scan_equals_sequential(T):
    g = torch.Generator().manual_seed(2)
    a, b = torch.rand(2, T, 6, 4, generator=g), torch.randn(2, T, 6, 4, generator=g)
    h0 = torch.randn(2, 6, 4, generator=g)
    torch.testing.assert_close(scan_parallel(a, b, h0), scan_sequential(a, b, h0), atol=1e-5, rtol=1e-4)


def test_chunked_selective_scan_equals_whole():
    g = torch.Generator().manual_seed(3)
    B, T, E, N = 1, 50, 6, 4
    u, delta = torch.randn(B, T, E, generator=g), torch.rand(B, T, E, generator=g)
    Bt, Ct = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g)
    A, D, h0 = -torch.rand(E, N, generator=g), torch.randn(E, generator=g), torch.randn(B, E, N, generator=g)
    whole = selective_scan(u, delta, A, Bt, Ct, D, h0)
    for mode, chunk in (("parallel", 7), ("sequential", None), ("sequential", 16)):
        part = selective_scan(u, delta, A, Bt, Ct, D, h0, mode, chunk)
        torch.testing.assert_close(part[0], whole[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(part[1], whole[1], atol=1e-5, rtol=1e-4)


def test_sliding_window_cache_has_constant_bytes():
    model = build_model(ModelConfig(dim=32, n_layers=2, n_heads=4, kernel="sliding", window=8, vocab_size=50)).eval()
    state = model.new_state(1, 10_000)
    before = state.nbytes
    assert before == 2 * 2 * 4 * 8 * 8 * 4  # K and V, 2 layers, 4 heads, 8 slots, head_dim 8, fp32
    with torch.no_grad():
        model(torch.randint(0, 50, (1, 20)), state)
        for _ in range(50):
            model(torch.randint(0, 50, (1, 1)), state)
    assert state.nbytes == before and state.pos.tolist() == [70]


def _depths(cfg_kw, lens):
    cfg = ModelConfig(dim=16, n_layers=1, n_heads=2, vocab_size=20, pos="none", max_seq_len=4096, **cfg_kw)
    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    return [trace(model, torch.zeros(1, T, dtype=torch.long, device="meta")).depth for T in lens]


def test_scan_depths_grow_like_log_T_and_T():
    par = _depths(dict(family="ssm", scan="parallel"), [64, 128, 256, 512])
    steps = [b - a for a, b in zip(par, par[1:])]
    assert steps[0] == steps[1] == steps[2] > 0  # one more round per doubling: depth ~ log2 T
    seq = _depths(dict(family="ssm", scan="sequential"), [64, 128, 256])
    assert seq[2] - seq[1] == 2 * (seq[1] - seq[0]) > 0  # linear in T
    assert seq[2] > 5 * par[2]
    lin = _depths(dict(family="linear", chunk_size=16), [64, 256, 1024])
    assert lin[0] == lin[1] == lin[2]  # chunk states combine with one cumulative sum


@pytest.mark.parametrize("kw", [dict(kernel="flash"), dict(kernel="sliding", window=5), dict(kernel="block_sparse"),
                                dict(family="linear", pos="none"), dict(family="ssm", pos="none")])
def test_new_models_train_and_decode(kw):
    from attnlab.engine import generate
    from attnlab.fit import lm_loss

    model = build_model(ModelConfig(dim=32, n_layers=2, n_heads=4, vocab_size=30, max_seq_len=64, **kw))
    x = torch.randint(0, 30, (2, 20))
    loss = lm_loss(model(x)[0], torch.roll(x, -1, 1))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    assert len(generate(model.eval(), [1, 2, 3], 5).tokens) == 5


@pytest.mark.parametrize("width", [1, 4])
def test_short_conv_in_pieces_equals_one_pass(width):
    """A short convolution fed a sequence in ragged pieces, carrying its tail, equals one pass over each row's
    real tokens: the tail holds exactly the last width - 1 real inputs, whatever the filler after them."""
    from attnlab.models.short_conv import ShortConv

    torch.manual_seed(0)
    conv = ShortConv(6, width)
    x = torch.randn(3, 11, 6)
    whole, _ = conv(x)
    cut = torch.tensor([2, 5, 1])  # row b's first piece: its first cut[b] tokens, then filler
    first = torch.where(torch.arange(5)[None, :, None] < cut[:, None, None], x[:, :5], torch.randn(3, 5, 6))
    y1, tail = conv(first, lengths=cut)
    for b in range(3):
        c = int(cut[b])
        y2, _ = conv(x[b:b + 1, c:], tail[b:b + 1])
        assert torch.allclose(torch.cat([y1[b, :c], y2[0]]), whole[b], atol=1e-6)


def _reference_selective_scan(u, delta, A, Bt, Ct, D, h0):
    """The recurrence written out with autograd: the whole (B, T, E, N) a and b, then the plain loop."""
    a = torch.exp(delta[..., None] * A)  # (B, T, E, N)
    b = (delta * u)[..., None] * Bt[:, :, None, :]
    hs = scan_sequential(a, b, h0)
    return (hs * Ct[:, :, None, :]).sum(-1) + D * u, hs[:, -1]


@pytest.mark.parametrize("path", ["loop", "native"])
@pytest.mark.parametrize("N, use_last", [(3, False), (19, True)])
def test_ssm_sequential_scan_backward_equals_autograd(path, N, use_last, monkeypatch):
    """The sequential scan's hand-written backward (ssm_loop.py's loop, kernels/ssm_scan.cpp) gives autograd's
    gradients for every input, h0 included, whether or not the final state feeds the loss; N = 19 has a tail
    after whole vectors. The reference is autograd through the written-out recurrence in float64."""
    from attnlab import kernels
    from attnlab.models import ssm_loop

    if path == "native" and kernels.native() is None:
        pytest.skip("attnlab's kernels are not built here (no compiler)")
    if path == "loop":
        monkeypatch.setattr(ssm_loop, "_native", lambda *t: None)
    g = torch.Generator().manual_seed(4)
    B, T, E = 3, 9, 5
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    inputs = [mk(B, T, E), torch.rand(B, T, E, generator=g, dtype=torch.float64) * 0.5,
              -torch.rand(E, N, generator=g, dtype=torch.float64) * 2, mk(B, T, N), mk(B, T, N), mk(E), mk(B, E, N)]
    w_y, w_h = mk(B, T, E), mk(B, E, N)
    dtype = torch.float32 if path == "native" else torch.float64

    def grads(fn, dtype):
        xs = [x.to(dtype).requires_grad_() for x in inputs]
        y, h = fn(*xs)
        loss = (y * w_y.to(dtype)).sum() + ((h * w_h.to(dtype)).sum() if use_last else 0)
        loss.backward()
        return y.detach().double(), h.detach().double(), [x.grad.double() for x in xs]

    y1, h1, g1 = grads(lambda *xs: selective_scan(*xs, mode="sequential"), dtype)
    y2, h2, g2 = grads(_reference_selective_scan, torch.float64)
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(y1, y2, **tol)
    torch.testing.assert_close(h1, h2, **tol)
    for name, a, b in zip(("u", "delta", "A", "B", "C", "D", "h0"), g1, g2):
        torch.testing.assert_close(a, b, **tol, msg=lambda m, name=name: f"gradient of {name}: {m}")
    with torch.no_grad():  # the inference path gives the same output
        y3, h3 = selective_scan(*[x.to(dtype) for x in inputs], mode="sequential")
    torch.testing.assert_close(y3.double(), y1)
    torch.testing.assert_close(h3.double(), h1)

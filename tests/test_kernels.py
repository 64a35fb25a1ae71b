"""attnlab's compiled few-rows linear kernel (attnlab/kernels): results, batch invariance, the fallback."""
import subprocess
import sys

import pytest
import torch

from attnlab import kernels
from attnlab.engine.quantize import DenseLinear, Int8Linear

native = kernels.native()
needs_kernel = pytest.mark.skipif(native is None, reason="no C++ compiler or Python headers here: the kernel cannot build")
NONE = torch.empty(0)


@needs_kernel
@pytest.mark.parametrize("n, k", [(24, 40), (29, 768), (7, 5), (64, 3072)])  # tails in channels (n % 4), lanes (k % 16)
def test_few_rows_linear_matches_fp32_arithmetic_and_a_batch_equals_each_row_alone(n, k):
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g)
    wb = w.to(torch.bfloat16)
    scale = w.abs().amax(1) / 127
    q = (w / scale[:, None]).round().to(torch.int8)
    bias = torch.randn(n, generator=g)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16):  # each remainder after groups of 4 (VNNI int8) and of 6 (AVX-512)
        x = torch.randn(m, k, generator=g)
        y = native.linear(x, wb, NONE, NONE)
        torch.testing.assert_close(y, x @ wb.float().t(), atol=1e-4, rtol=1e-4)
        y32 = native.linear(x, w, NONE, bias)
        torch.testing.assert_close(y32, x @ w.t() + bias, atol=1e-4, rtol=1e-4)
        assert torch.equal(y32, torch.cat([native.linear(x[i:i + 1], w, NONE, bias) for i in range(m)]))
        yq = native.linear(x, q, scale, bias)
        if native.int8_rows_as_int16():
            assert torch.equal(yq, int16_rows_emulated(x, q, scale, bias))
        else:
            torch.testing.assert_close(yq, x @ (q.float() * scale[:, None]).t() + bias, atol=1e-4, rtol=1e-4)
        # every (row, channel) is the same sum in the same order, whatever rows share the call (groups, then the rest)
        assert torch.equal(y, torch.cat([native.linear(x[i:i + 1], wb, NONE, NONE) for i in range(m)]))
        assert torch.equal(yq, torch.cat([native.linear(x[i:i + 1], q, scale, bias) for i in range(m)]))
    xb = torch.randn(3, k, generator=g).to(torch.bfloat16)  # bf16 activations in, bf16 out (rounded once)
    yb = native.linear(xb, wb, NONE, NONE)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, (xb.float() @ wb.float().t()).to(torch.bfloat16), atol=0, rtol=2 ** -7)


def int16_rows_emulated(x, q, scale, bias=None):
    """The int8 kernel's arithmetic where it quantizes rows (VNNI): each row to int16 with step max|x| / 32767 (its
    fp32 reciprocal, rounded to nearest even), the exact integer dot products, times the step in double, rounded to
    fp32, then times the channel's scale and plus the bias in fp32."""
    amax = x.abs().amax(1, keepdim=True)  # (M, 1)
    inv = torch.where(amax > 0, (32767 / amax.double()).float(), torch.zeros_like(amax))
    xq = torch.round(x * inv)  # fp32 product, half to even: as the kernel's conversion
    dots = xq.double() @ q.double().t()  # (M, N): exact (every partial sum < 2^53)
    y = (dots * (amax.double() / 32767)).float() * scale
    return y if bias is None else y + bias


@needs_kernel
@pytest.mark.skipif(native is None or not native.int8_rows_as_int16(), reason="int8 rows meet fp32 weights here")
def test_int8_rows_as_int16_are_exact_integers_within_half_a_step_and_pass_inf_and_nan_on():
    """Where the int8 kernel quantizes each row to int16 (VNNI), each output is the exact integer dot product
    scaled (the emulation, bit for bit, at widths past one 4,096-long integer chunk too), within half a step of
    the row times the weight row's absolute sum of fp32 arithmetic on the same weights; a row of zeros gives the
    bias; a row holding an inf or a NaN, or too small for an fp32 step, takes the fp32 path alone (passing an inf
    or a NaN on), and the rows beside it are as they are alone."""
    g = torch.Generator().manual_seed(3)
    for n, k in ((12, 4096 + 80), (9, 8192 + 32), (5, 47)):
        w = torch.randn(n, k, generator=g)
        scale = w.abs().amax(1) / 127
        q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
        wq = q.double() * scale.double()[:, None]
        # 7 rows: a group of 4 and one of 3, across the 4,096-long integer chunks too
        x = torch.randn(7, k, generator=g) * torch.logspace(-2, 3, 7)[:, None]  # rows of every scale
        x[2] = 0
        x[4, 3] = 300.0 * x[4].abs().max()  # one outlier: every other entry of its row rounds on a coarse step
        got = native.linear(x, q, scale, NONE)
        assert torch.equal(got, int16_rows_emulated(x, q, scale))
        assert torch.equal(got[2], torch.zeros(n))
        exact = x.double() @ wq.t()
        step = x.double().abs().amax(1, keepdim=True) / 32767
        bound = step / 2 * wq.abs().sum(1) + 1e-6 * exact.abs() + 1e-30
        assert ((got.double() - exact).abs() <= bound).all()
    x = torch.randn(4, 47, generator=g)
    x[0, 3], x[1, 40] = float("inf"), float("nan")
    x[3] *= 1e-36  # too small a largest entry for an fp32 reciprocal: the fp32 path, not garbage
    got = native.linear(x, q, scale, NONE)
    assert not got[0].isfinite().any() and got[1].isnan().all()
    assert torch.equal(got[2], int16_rows_emulated(x[2:3], q, scale)[0])  # the rows beside are as alone
    for r in range(4):
        assert torch.equal(got[r].nan_to_num(), native.linear(x[r:r + 1], q, scale, NONE)[0].nan_to_num())
    torch.testing.assert_close(got[3].double(), (x[3:4].double() @ (q.double() * scale.double()[:, None]).t())[0],
                               rtol=1e-5, atol=0)
    xb = x.to(torch.bfloat16)  # bf16 rows in, bf16 out: the inf and NaN rows' fp32 path writes bf16 rows too
    gotb = native.linear(xb, q, scale, NONE)
    assert gotb.dtype == torch.bfloat16 and not gotb[0].isfinite().any() and gotb[1].isnan().all()
    assert torch.equal(gotb[2], int16_rows_emulated(xb[2:3].float(), q, scale)[0].to(torch.bfloat16))


@pytest.mark.skipif(native is None or not native.int8_rows_as_int16(), reason="int8 rows meet fp32 weights here")
def test_int8_rows_as_int16_sum_the_largest_products_without_overflow():
    """Every product at its largest (32767 * -128) over two 4,096-long chunks and a tail: an int32 lane holds a
    chunk's share (1.07e9 < 2^31), the chunks add in int64, so the sum is exact where one int32 sum would wrap."""
    k = 2 * 4096 + 16
    q = torch.full((4, k), -128, dtype=torch.int8)
    x = torch.ones(3, k)
    got = native.linear(x, q, torch.ones(4), NONE)
    assert torch.equal(got, torch.full((3, 4), -128.0 * k))


@needs_kernel
def test_few_rows_linear_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="x \\(M, K\\) and w \\(N, K\\)"):
        native.linear(torch.randn(2, 8), torch.randn(4, 9).to(torch.bfloat16), NONE, NONE)
    with pytest.raises(RuntimeError, match="fp32, bf16 or int8"):
        native.linear(torch.randn(2, 8), torch.randn(4, 8).half(), NONE, NONE)
    with pytest.raises(RuntimeError, match="one entry per output channel"):
        native.linear(torch.randn(2, 8), torch.randn(4, 8).to(torch.bfloat16), torch.ones(3), NONE)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_linears_on_the_kernel_give_the_library_paths_results(bias, monkeypatch):
    lin = torch.nn.Linear(96, 40, bias=bias)
    monkeypatch.setattr(DenseLinear, "_chosen", {(96, 40, torch.bfloat16, 4, bias, False): "few_rows"})
    dense = DenseLinear(lin, torch.bfloat16, 4)
    assert dense.path == "few_rows"
    monkeypatch.setattr(Int8Linear, "_chosen", {(96, 40, 4, bias, False): "few_rows"})
    q = Int8Linear(lin, torch.bfloat16, 4)
    assert q.path == "few_rows"
    for m in (1, 4, 16, 40):  # 40 rows: past kernels.MAX_ROWS, the library's kernels
        x = torch.randn(m, 96).to(torch.bfloat16)
        torch.testing.assert_close(dense(x).float(), torch.nn.functional.linear(x.float(), dense.weight.float(),
                                   None if dense.bias is None else dense.bias.float()), atol=2e-2, rtol=2e-2)
        ref = x.float() @ q.dequantized.t() + (0 if q.bias is None else q.bias.float())
        torch.testing.assert_close(q(x).float(), ref, atol=2e-2, rtol=2e-2)


def test_attnlab_kernels_0_falls_back_to_torch_kernels():
    """ATTNLAB_KERNELS=0 (the benchmarks' other side): nothing is built or loaded, bf16/int8 still run."""
    code = ("import torch; from attnlab import kernels; from attnlab.engine.quantize import Int8Linear, DenseLinear;"
            "assert kernels.native() is None; lin = torch.nn.Linear(32, 16);"
            "q = Int8Linear(lin, torch.bfloat16); d = DenseLinear(lin, torch.bfloat16);"
            "assert q.path == 'int8pack' and d.path != 'few_rows', (q.path, d.path);"
            "x = torch.randn(2, 32).bfloat16(); q(x); d(x); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "ATTNLAB_KERNELS": "0"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@needs_kernel
@pytest.mark.parametrize("heads, kv_heads, d", [(4, 4, 64), (6, 2, 24), (2, 1, 5)])  # GQA; D not a multiple of the lanes
def test_decode_attention_equals_sdpa_over_each_rows_keys_contiguous_and_paged(heads, kv_heads, d):
    g = torch.Generator().manual_seed(heads * d)
    lens = [1, 17, 40, 0, 33]  # a row with no keys gets zeros
    B, max_len = len(lens), 48
    q = torch.randn(B, heads, d, generator=g)
    k = torch.randn(B, kv_heads, max_len, d, generator=g)
    v = torch.randn(B, kv_heads, max_len, d, generator=g)
    scale = d ** -0.5
    ref = torch.zeros(B, heads, d)
    for b, n in enumerate(lens):
        if n:
            ref[b] = torch.nn.functional.scaled_dot_product_attention(
                q[b:b + 1, :, None], k[b:b + 1, :, :n], v[b:b + 1, :, :n], scale=scale, enable_gqa=True)[0, :, 0]
    lens_t = torch.tensor(lens)
    got = native.decode_attention(q, k, v, *k.stride()[:3], torch.empty(0, dtype=torch.long), 0, lens_t, kv_heads, scale)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # the same keys in a pool of 8-token blocks, scattered, read through block tables
    bs, n_blocks = 8, B * max_len // 8
    perm = torch.randperm(n_blocks, generator=g)
    pk, pv = torch.zeros(kv_heads, n_blocks * bs, d), torch.zeros(kv_heads, n_blocks * bs, d)
    tables = perm.view(B, max_len // bs)
    for b in range(B):
        for i in range(max_len // bs):
            blk = int(tables[b, i])
            pk[:, blk * bs:(blk + 1) * bs] = k[b, :, i * bs:(i + 1) * bs]
            pv[:, blk * bs:(blk + 1) * bs] = v[b, :, i * bs:(i + 1) * bs]
    paged = native.decode_attention(q, pk, pv, 0, pk.stride(0), pk.stride(1), tables.contiguous(), bs, lens_t,
                                    kv_heads, scale)
    assert torch.equal(paged, got)  # the same sums whichever way the keys are found
    alone = torch.cat([native.decode_attention(q[b:b + 1].contiguous(), k[b:b + 1], v[b:b + 1], *k.stride()[:3],
                                               torch.empty(0, dtype=torch.long), 0, lens_t[b:b + 1], kv_heads, scale)
                       for b in range(B)])
    assert torch.equal(alone, got)  # a row's result does not depend on the other rows


@needs_kernel
def test_decode_attention_reads_a_bf16_cache():
    g = torch.Generator().manual_seed(3)
    B, H, Hkv, d, max_len = 3, 4, 2, 64, 40
    lens = torch.tensor([40, 7, 23])
    q = torch.randn(B, H, d, generator=g)
    k = torch.randn(B, Hkv, max_len, d, generator=g).to(torch.bfloat16)
    v = torch.randn(B, Hkv, max_len, d, generator=g).to(torch.bfloat16)
    got = native.decode_attention(q, k, v, *k.stride()[:3], torch.empty(0, dtype=torch.long), 0, lens, Hkv, 0.125)
    want = native.decode_attention(q, k.float(), v.float(), *k.stride()[:3], torch.empty(0, dtype=torch.long), 0, lens,
                                   Hkv, 0.125)
    assert torch.equal(got, want)  # widened in registers: the same sums as over the widened cache


@needs_kernel
def test_the_compiled_gelu_is_torchs_tanh_gelu_in_place_and_under_autograd():
    """Outside autograd in place; under it, forward and backward compiled, the input left as it was. Both against
    the same function in float64, as close as torch's own fp32 GELU is."""
    from attnlab.models.layers import gelu_tanh_

    x = torch.randn(300, 1000) * 6
    x[0, :4] = torch.tensor([0.0, -100.0, 100.0, 1e-7])
    want = torch.nn.functional.gelu(x, approximate="tanh")
    with torch.no_grad():
        got = gelu_tanh_(x.clone())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    g = torch.randn(300, 1000)
    exact = x.double().requires_grad_()
    torch.nn.functional.gelu(exact, approximate="tanh").backward(g.double())
    leaf = x.clone().requires_grad_()
    h = leaf * 1
    out = gelu_tanh_(h)
    out.backward(g)
    assert torch.equal(h, x)  # the input is kept for the backward, not overwritten
    torch.testing.assert_close(out.detach(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(leaf.grad.double(), exact.grad, atol=2e-5, rtol=1e-5)
    assert out.grad_fn is not None and "GeluTanh" in type(out.grad_fn).__name__


@needs_kernel
def test_the_compiled_gelu_on_bf16_rounds_its_fp32_value_once_and_is_no_further_from_the_truth_than_torchs():
    """A bf16 activation (an int8 model's prefill): each value widened, its GELU in fp32, rounded once. Against
    float64's GELU rounded to bf16 it may differ by the fp32 formula's error at a rounding boundary (rarely), and
    no more often than torch's bf16 GELU does; infs and NaNs go through as the fp32 kernel passes them."""
    from attnlab.models.layers import gelu_tanh_

    torch.manual_seed(0)
    x = (torch.randn(256, 1024) * 4).to(torch.bfloat16)
    x[0, :4] = torch.tensor([float("nan"), float("inf"), 0.0, -0.0])
    with torch.no_grad():
        got = gelu_tanh_(x.clone())
    assert got.dtype == torch.bfloat16
    xd = x.double()
    truth = (xd / (1 + torch.exp(-2 * 0.7978845608028654 * (xd + 0.044715 * xd ** 3)))).to(torch.bfloat16)
    fin = x.isfinite()
    ours = (got[fin] != truth[fin]).float().mean().item()
    torchs = (torch.nn.functional.gelu(x, approximate="tanh")[fin] != truth[fin]).float().mean().item()
    assert ours < 0.02 and ours <= torchs  # 0.6% against torch's 13% here (its 1 + tanh cancels for v < 0)
    # one bf16 step at most, or the fp32 kernel's absolute tolerance where the value is tiny (its exponent is
    # clamped at 87, so far below -10 it returns v / (1 + e^87) for a true value nearer 0)
    step = truth[fin].float().abs() * 2 ** -7 + 1e-6
    assert ((got[fin].float() - truth[fin].float()).abs() <= step).all()
    assert got[0, 0].isnan() and got[0, 1] == float("inf") and got[0, 2] == 0
    assert got.view(torch.int16)[0, 0] == 0x7FC0  # torch's scalar rounding of a NaN
    odd = (torch.randn(257, 1021) * 4).to(torch.bfloat16)  # vector tails and uneven thread chunks
    with torch.no_grad():
        wide = gelu_tanh_(odd.float())  # the fp32 kernel, chunked at the same elements
        assert torch.equal(gelu_tanh_(odd.clone()), wide.to(torch.bfloat16))  # the same value, rounded once


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M, K, N", [(512, 768, 1024), (37, 3072, 40), (5, 61, 77)])  # tails of the lanes in K and N
def test_int8_row_quantization_and_scaling_are_torchs_ops_bit_for_bit(dtype, M, K, N):
    """quantize_rows_int8 and scale_rows_int32 (Int8Linear's w8a8 ends) equal the torch ops they replace, bit for
    bit: rows of every scale, a zero row, and a row with an inf or a NaN flagged (no integer step), the others
    unchanged by it."""
    torch.manual_seed(0)
    x = (torch.randn(M, K) * torch.logspace(-6, 3, M)[:, None]).to(dtype)  # (M, K): rows of every scale
    x[min(2, M - 1)] = 0
    q, step, finite = native.quantize_rows_int8(x)
    xf = x.float()
    want_step = xf.abs().amax(1, keepdim=True).clamp_(min=1e-12).div_(127.0)  # (M, 1)
    assert finite and torch.equal(step, want_step)
    assert torch.equal(q, torch.div(xf, want_step).round_().to(torch.int8))
    acc = torch.randint(-2 ** 24, 2 ** 24, (M, N), dtype=torch.int32)
    scale, bias = torch.rand(N) / 100, torch.randn(N)
    for b in (bias, NONE):
        want = acc.to(torch.float32).mul_(want_step).mul_(scale)
        if b.numel():
            want.add_(b)
        assert torch.equal(native.scale_rows_int32(acc, want_step, scale, b, dtype), want.to(dtype))
    x[0, 0], x[1, 1] = float("nan"), float("inf")
    q2, step2, finite = native.quantize_rows_int8(x)
    assert not finite and not step2[:2].isfinite().any() and torch.equal(step2[2:], step[2:])
    assert torch.equal(q2[2:], q[2:])
    with pytest.raises(RuntimeError, match="fp32 or bf16"):
        native.quantize_rows_int8(x.to(torch.float16))
    with pytest.raises(RuntimeError, match="one fp32 scale per column"):
        native.scale_rows_int32(acc, step, scale[:-1], NONE, dtype)


@needs_kernel
@pytest.mark.parametrize("B,T,H,D", [(3, 37, 4, 16), (1, 5, 3, 128), (2, 1, 2, 64)])
def test_the_compiled_rotary_is_torchs_bit_for_bit_and_its_gradient_too(B, T, H, D):
    """positional.apply_rotary through rope.cpp == the torch formula exactly, on heads that are a strided view of a
    fused projection (as the model's split makes them), forward and backward; per-sequence angles fall back."""
    from attnlab.models.positional import Rope, apply_rotary

    def reference(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D) * 3
    cos, sin = Rope(D).cos_sin(torch.arange(T) + 7, torch.float32)
    grads = []
    for fn in (apply_rotary, reference):
        leaf = qkv.clone().requires_grad_()
        q = leaf[..., :H * D].view(B, T, H, D).transpose(1, 2)  # (B, H, T, D), not contiguous
        out = fn(q, cos, sin)
        out.backward(torch.ones_like(out) * torch.arange(D))
        grads.append((out.detach(), leaf.grad))
        if fn is apply_rotary:
            assert "Rotary" in type(out.grad_fn).__name__
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    strides = [[st for st, n in zip(o.stride(), o.shape) if n > 1] for o, _ in grads]  # a size-1 dim's is moot
    assert strides[0] == strides[1]  # torch's layout: what the compiled prefill attention reads
    x = torch.randn(B, H, T, D, requires_grad=True)  # any angles, halves unequal: the gradient is the transpose
    cos, sin = torch.randn(T, D), torch.randn(T, D)
    (g_ours,) = torch.autograd.grad(apply_rotary(x, cos, sin), x, torch.arange(D) + torch.ones(B, H, T, D))
    (g_ref,) = torch.autograd.grad(reference(x, cos, sin), x, torch.arange(D) + torch.ones(B, H, T, D))
    assert torch.equal(g_ours, g_ref)
    per_row = Rope(D).cos_sin(torch.arange(T).repeat(B, 1), torch.float32)  # (B, 1, T, D): torch's formula
    x = torch.randn(B, H, T, D)
    assert torch.equal(apply_rotary(x, *per_row), reference(x, *per_row))


@needs_kernel
@pytest.mark.parametrize("B,H,Hkv,T,S,D", [(1, 12, 12, 300, 300, 64), (2, 4, 2, 37, 37, 64), (1, 2, 2, 5, 70, 32),
                                            (2, 4, 4, 100, 233, 128), (1, 3, 1, 2, 9, 16), (1, 2, 2, 65, 65, 80)])
def test_prefill_attention_equals_the_naive_kernel_causal_at_the_end(B, H, Hkv, T, S, D):
    """The compiled prefill attention == the naive reference: queries are the last T of S keys (a cache prefix
    when S > T), grouped-query heads, block edges (T not a multiple of the query block), head sizes 1 to 8 vectors."""
    from attnlab.models.attention import KERNELS, compiled_prefill

    torch.manual_seed(0)
    qkv = torch.randn(B, T, H * D + 2 * Hkv * D)
    q = qkv[..., :H * D].view(B, T, H, D).transpose(1, 2)  # strided views, as the model's split makes them
    k, v = torch.randn(B, Hkv, S + 3, D)[:, :, :S], torch.randn(B, Hkv, S + 3, D)[:, :, :S]  # a cache's view
    with torch.no_grad():
        got = compiled_prefill(q, k, v, D ** -0.5)
        want = KERNELS["naive"](q, k, v, causal=True, alibi_slopes=None, scale=D ** -0.5)
        assert got is not None and got.shape == (B, H, T, D)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        assert got.transpose(1, 2).is_contiguous()  # merging the heads is a view


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_bf16_prefill_runs_the_compiled_kernel_widened_with_one_rounding(dtype):
    """A causal bf16 (fp16) prefill through the sdpa kernel runs the compiled fp32 kernel on widened q, k, v: the
    output is the exact attention of the narrow inputs rounded once to their dtype, in the (B, T, H, D) memory that
    merges the heads for free; torch's bf16 kernel rounds its intermediate products too."""
    from attnlab.kernels import paths
    from attnlab.models.attention import KERNELS, sdpa_attention

    torch.manual_seed(0)
    B, H, T, D = 2, 4, 70, 64
    qkv = torch.randn(B, T, 3, H, D).to(dtype)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, D) views of the fused projection
    with torch.no_grad():
        before = paths.snapshot()
        got = sdpa_attention(q, k, v, causal=True, alibi_slopes=None, scale=D ** -0.5)
        assert paths.since(before).get("prefill_attention") == 1
        exact = KERNELS["naive"](q.double(), k.double(), v.double(), causal=True, alibi_slopes=None,
                                 scale=D ** -0.5)
    assert got.dtype == dtype and got.shape == (B, H, T, D) and got.transpose(1, 2).is_contiguous()
    eps = torch.finfo(dtype).eps
    # one rounding to the dtype (half an ulp, eps relative) plus the fp32 kernel's own error
    assert ((got.double() - exact).abs() <= eps * exact.abs() + 1e-5).all()


@needs_kernel
def test_prefill_attention_stays_out_where_it_does_not_apply():
    from attnlab.models.attention import compiled_prefill, sdpa_attention

    q, k, v = torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    with torch.no_grad():
        assert compiled_prefill(q.half(), k.half(), v.half(), 0.125) is None  # fp32 only, unless told to widen
        assert compiled_prefill(q.half(), k, v, 0.125, widen=True) is None  # mixed dtypes
        assert compiled_prefill(q[..., :24], k[..., :24], v[..., :24], 0.2) is None  # not whole vectors
        assert compiled_prefill(q, k[:, :, :4], v[:, :, :4], 0.125) is None  # more queries than keys
    leaf = q.clone().requires_grad_()
    assert compiled_prefill(leaf, k, v, 0.125) is None  # autograd: torch's kernel, whose backward exists
    out = sdpa_attention(leaf, k, v, causal=True, alibi_slopes=None, scale=0.125)
    out.sum().backward()
    assert leaf.grad is not None
    with torch.no_grad():  # non-causal models keep torch's kernel (the compiled one is causal only)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
        assert torch.equal(sdpa_attention(q, k, v, causal=False, alibi_slopes=None, scale=0.125), want)


@needs_kernel
@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_a_rope_models_prefill_runs_the_compiled_attention_with_torchs_result(n_kv_heads):
    """RoPE's rotated keys are fresh memory while the values are a view of the fused projection (rows apart by
    different strides); the values are copied into the keys' layout so the compiled kernel still runs, and the
    forward equals torch's kernel's, with grouped-query heads too."""
    from attnlab.config import ModelConfig
    from attnlab.kernels import paths
    from attnlab.models import build_model
    from attnlab.models.attention import KERNELS

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=64, dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                                    max_seq_len=64, pos="rope"), "cpu")
    model.eval()
    x = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        before = paths.snapshot()
        got = model(x)[0]
        counts = paths.since(before)
        assert counts.get("prefill_attention") == 2 and "prefill_attention fallback" not in str(counts)
        for block in model.backbone.blocks:
            block.attn.kernel = KERNELS["naive"]
        want = model(x)[0]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)

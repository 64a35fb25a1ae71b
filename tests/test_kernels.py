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
    for m in (1, 2, 3, 5, 8, 16):
        x = torch.randn(m, k, generator=g)
        y = native.linear(x, wb, NONE, NONE)
        torch.testing.assert_close(y, x @ wb.float().t(), atol=1e-4, rtol=1e-4)
        y32 = native.linear(x, w, NONE, bias)
        torch.testing.assert_close(y32, x @ w.t() + bias, atol=1e-4, rtol=1e-4)
        assert torch.equal(y32, torch.cat([native.linear(x[i:i + 1], w, NONE, bias) for i in range(m)]))
        yq = native.linear(x, q, scale, bias)
        torch.testing.assert_close(yq, x @ (q.float() * scale[:, None]).t() + bias, atol=1e-4, rtol=1e-4)
        # every (row, channel) is the same sum in the same order, whatever rows share the call (rows go 4, 2, 1)
        assert torch.equal(y, torch.cat([native.linear(x[i:i + 1], wb, NONE, NONE) for i in range(m)]))
        assert torch.equal(yq, torch.cat([native.linear(x[i:i + 1], q, scale, bias) for i in range(m)]))
    xb = torch.randn(3, k, generator=g).to(torch.bfloat16)  # bf16 activations in, bf16 out (rounded once)
    yb = native.linear(xb, wb, NONE, NONE)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, (xb.float() @ wb.float().t()).to(torch.bfloat16), atol=0, rtol=2 ** -7)


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
def test_decode_steps_through_the_fused_kernel_match_the_library_kernel(monkeypatch):
    """A model decoding through its caches (contiguous, ragged, paged) with the fused decode attention gives the
    logits of the same model with the fused path turned off (SDPA row by row)."""
    from attnlab.engine.generate import generate
    from attnlab.models import build_model
    from attnlab.models import state as state_mod
    from conftest import tiny

    torch.manual_seed(0)
    model = build_model(tiny(max_seq_len=128, n_kv_heads=2)).eval()
    prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 0, -1))]
    calls = []
    real = state_mod.fused_decode

    def counting(*a, **kw):
        out = real(*a, **kw)
        calls.append(out is not None)
        return out
    monkeypatch.setattr(state_mod, "fused_decode", counting)
    import attnlab.models.paged as paged_mod
    monkeypatch.setattr(paged_mod, "fused_decode", counting)
    used = _count_steps(monkeypatch)
    whole = [generate(model, prompts, 10, paged=p) for p in (False, True)]  # block_decode: the whole block
    assert used and all(used)
    from attnlab.models import block_step
    monkeypatch.setattr(block_step, "ENABLED", False)  # the blocks' forward, attention by fused_decode
    fused = [generate(model, prompts, 10, paged=p) for p in (False, True)]
    assert calls and all(calls)
    monkeypatch.setattr(kernels, "_state", {"native": None})  # the library kernel only
    plain = [generate(model, prompts, 10, paged=p) for p in (False, True)]
    for ours in (whole, fused):
        for a, b in zip(ours, plain):
            assert [c.tokens for c in a.completions] == [c.tokens for c in b.completions]
            for x, y in zip(a.completions, b.completions):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


def _decode_logits(model, prompts, steps: int, paged: bool = False):
    """Prefill a ragged batch, then `steps` greedy decode steps; the logits of every step, stacked."""
    B = len(prompts)
    state = model.new_state(B, 64, paged=paged, block_size=4)
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    with torch.inference_mode():
        logits, _ = model(ids, state, last_only=True, lengths=torch.tensor([len(p) for p in prompts]))
        out = [logits[:, -1].float()]
        for _ in range(steps):
            logits, _ = model(logits[:, -1].argmax(-1, keepdim=True), state)
            out.append(logits[:, -1].float())
    return torch.stack(out)


def _count_steps(monkeypatch):
    from attnlab.models import block_step
    used = []
    real = block_step.step

    def counting(*a):
        out = real(*a)
        used.append(out is not None)
        return out
    monkeypatch.setattr(block_step, "step", counting)
    return used


@needs_kernel
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", ["nn.Linear", "few_rows", "matmul"])
def test_the_compiled_block_step_computes_the_blocks_forward(arch, layout, monkeypatch):
    """Decode steps through block_step.cpp (norm + qkv; out projection + residual + norm + MLP + residual) give the
    logits of the blocks' own forward, for GPT-2's block (LayerNorm with bias, GELU, learned positions) and
    Llama's (RMSNorm, SwiGLU, RoPE, grouped-query), with weights as nn.Linear or DenseLinear in either layout
    the compiled step reads, on a ragged batch, through the contiguous and the paged cache."""
    from attnlab.engine.quantize import set_precision
    from attnlab.models import block_step, build_model
    from conftest import tiny

    cfg = (tiny(norm="layernorm", mlp="gelu", pos="learned", bias=True, dim=48, n_layers=3) if arch == "gpt2" else
           tiny(norm="rmsnorm", mlp="swiglu", pos="rope", n_kv_heads=2, dim=48, n_layers=3))
    model = build_model(cfg).eval()
    if layout != "nn.Linear":
        monkeypatch.setattr(DenseLinear, "_chosen", {k: layout for k in [
            (i, o, torch.float32, 1, b, False) for i, o in ((48, 144), (48, 96), (48, 48), (48, 192), (192, 48),
                                                             (48, 128), (128, 48), (48, 37)) for b in (False, True)]})
        set_precision(model, "fp32")
    prompts = [list(range(1, 12)), [5, 6, 7], list(range(30, 10, -1))]
    from attnlab.models.attention import Attention
    mixes = []
    real_mix = Attention.mix
    monkeypatch.setattr(Attention, "mix", lambda self, *a: mixes.append(1) or real_mix(self, *a))
    for paged in (False, True):
        used = _count_steps(monkeypatch)
        mixes.clear()
        fused = _decode_logits(model, prompts, 6, paged)
        assert used and all(used), "every decode step of every block went through the compiled step"
        assert len(mixes) == cfg.n_layers  # the prefill's only: each decode step was one call a block (block_decode)
        monkeypatch.setattr(block_step, "ENABLED", False)
        plain = _decode_logits(model, prompts, 6, paged)
        monkeypatch.setattr(block_step, "ENABLED", True)
        torch.testing.assert_close(fused, plain, atol=2e-5, rtol=2e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_compiled_block_step_with_narrow_weights_stays_close_to_the_forward(dtype, monkeypatch):
    """bf16 and int8 weights (bf16 activations, bf16 cache): the compiled step keeps its activations in fp32,
    so it differs from the forward (which rounds them to bf16) by bf16 rounding only."""
    from attnlab.engine.quantize import set_precision
    from attnlab.models import block_step, build_model
    from conftest import tiny

    class FewRows(dict):  # every Int8Linear on attnlab's kernel (its measurement may pick torch's int8 one)
        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            return "few_rows"
    monkeypatch.setattr(Int8Linear, "_chosen", FewRows())
    model = set_precision(build_model(tiny(norm="rmsnorm", mlp="swiglu", dim=64, n_layers=2)).eval(), dtype)
    prompts = [list(range(1, 12)), [5, 6, 7]]
    used = _count_steps(monkeypatch)
    fused = _decode_logits(model, prompts, 4)
    assert used and all(used)
    monkeypatch.setattr(block_step, "ENABLED", False)
    plain = _decode_logits(model, prompts, 4)
    assert (fused - plain).abs().max() < 0.05 * plain.abs().max()


@needs_kernel
def test_the_compiled_block_step_stays_out_where_it_does_not_apply(monkeypatch):
    """ALiBi, a kernel under study, autograd (training) and a prefill-sized call run the blocks' forward."""
    from attnlab.models import build_model
    from conftest import tiny

    for cfg in (tiny(pos="alibi"), tiny(kernel="naive")):
        used = _count_steps(monkeypatch)
        _decode_logits(build_model(cfg).eval(), [[1, 2, 3]], 2)
        assert not any(used)
    model = build_model(tiny()).eval()
    used = _count_steps(monkeypatch)
    state = model.new_state(1, 32)
    model(torch.tensor([[1, 2, 3]]), state)  # autograd on: a training-style call
    model(torch.tensor([[4]]), state)
    with torch.inference_mode():
        model(torch.tensor([list(range(1, 20))]), model.new_state(1, 32))  # 19 rows: prefill-sized
    assert not any(used)


@needs_kernel
def test_the_compiled_block_step_sees_swapped_modules(monkeypatch):
    """A block keeps the arguments of its compiled step between steps; replacing one of its Linears (or a
    parameter) after a step is seen at the next one."""
    from attnlab.models import block_step, build_model
    from conftest import tiny

    model = build_model(tiny(dim=32)).eval()
    _decode_logits(model, [[1, 2, 3]], 1)  # plans kept
    blk = model.backbone.blocks[0]
    new = torch.nn.Linear(32, 32, bias=False)
    blk.attn.wo = new
    blk.mlp.w2.weight = torch.nn.Parameter(torch.randn_like(blk.mlp.w2.weight))
    fused = _decode_logits(model, [[1, 2, 3]], 2)
    monkeypatch.setattr(block_step, "ENABLED", False)
    torch.testing.assert_close(fused, _decode_logits(model, [[1, 2, 3]], 2), atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_compiled_block_step_sees_narrow_norm_weights_change_in_place(monkeypatch):
    """A bf16 model's norm weights are widened once, when the plan is built; changing one in place, or swapping
    its data, after a step rebuilds the plan at the next one."""
    from attnlab.engine.quantize import set_precision
    from attnlab.models import block_step, build_model
    from conftest import tiny

    model = set_precision(build_model(tiny(dim=32)).eval(), "bf16")
    _decode_logits(model, [[1, 2, 3]], 1)  # plans kept, with fp32 copies of the norms' bf16 weights
    blk = model.backbone.blocks[0]
    with torch.no_grad():
        blk.attn_norm.weight.mul_(3.0)
    blk.mlp_norm.weight.data = torch.randn_like(blk.mlp_norm.weight)
    fused = _decode_logits(model, [[1, 2, 3]], 2)
    monkeypatch.setattr(block_step, "ENABLED", False)
    plain = _decode_logits(model, [[1, 2, 3]], 2)
    assert (fused - plain).abs().max() < 0.05 * plain.abs().max()  # bf16 rounding apart, the same function
    widened = blk.__dict__["_step_plan"][3]
    assert widened and all(t.dtype == torch.bfloat16 for t, _ in widened)
    with torch.inference_mode():  # weights made as inference tensors have no version counter (cost --validate)
        inf_model = set_precision(build_model(tiny(dim=32)).eval(), "bf16")
        assert _decode_logits(inf_model, [[1, 2, 3]], 2).isfinite().all()


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
def test_the_compiled_gelu_is_torchs_tanh_gelu_and_stays_out_of_autograd():
    from attnlab.models.layers import gelu_tanh_

    x = torch.randn(300, 1000) * 6
    x[0, :4] = torch.tensor([0.0, -100.0, 100.0, 1e-7])
    want = torch.nn.functional.gelu(x, approximate="tanh")
    with torch.no_grad():
        got = gelu_tanh_(x.clone())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    leaf = x.clone().requires_grad_()
    out = gelu_tanh_(leaf * 1)  # autograd on: torch's gelu, whose backward exists
    out.sum().backward()
    assert leaf.grad is not None and torch.equal(out.detach(), want)


@needs_kernel
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_compiled_block_step_takes_several_new_tokens_a_row_causally(arch, monkeypatch):
    """A few new tokens per row in one call (a short prefill, a speculative verification's k + 1), through one
    compiled call a block: each new token sees the cache and the new tokens before it, not after."""
    from attnlab.models import block_step, build_model
    from conftest import tiny

    cfg = (tiny(norm="layernorm", mlp="gelu", pos="learned", bias=True, dim=48) if arch == "gpt2" else
           tiny(norm="rmsnorm", mlp="swiglu", pos="rope", n_kv_heads=2, dim=48))
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    chunks = [torch.randint(1, 37, (2, n), generator=g) for n in (5, 3, 4, 1)]  # 2 rows x 5 tokens: 10 rows

    def run(paged):
        state = model.new_state(2, 32, paged=paged, block_size=4)
        with torch.inference_mode():
            return torch.cat([model(c, state)[0] for c in chunks], dim=1)
    for paged in (False, True):
        used = _count_steps(monkeypatch)
        fused = run(paged)
        assert used and all(used)
        monkeypatch.setattr(block_step, "ENABLED", False)
        plain = run(paged)
        monkeypatch.setattr(block_step, "ENABLED", True)
        torch.testing.assert_close(fused, plain, atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_compiled_block_step_with_rows_at_different_positions_and_what_it_leaves_alone(monkeypatch):
    """Rows at different positions taking 3 new tokens each go through one call a block (each row's own slots);
    an fp16 cache and a non-causal model are left to the blocks' forward, with its results."""
    from attnlab.models import block_step, build_model
    from attnlab.models.attention import Attention
    from conftest import tiny

    model = build_model(tiny(pos="rope", n_kv_heads=2, dim=48)).eval()
    mixes = []
    real_mix = Attention.mix
    monkeypatch.setattr(Attention, "mix", lambda self, *a: mixes.append(1) or real_mix(self, *a))

    def run(paged, dtype=None):
        state = model.new_state(2, 32, paged=paged, block_size=4, dtype=dtype)
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]), state, lengths=torch.tensor([5, 2]))
            mixes.clear()  # the ragged prefill (filler in row 2) attends in Python; what follows is all real
            return torch.cat([model(torch.tensor([[3, 4, 5], [7, 8, 9]]), state)[0] for _ in range(2)], dim=1)
    for paged in (False, True):
        fused = run(paged)
        assert not mixes  # one compiled call a block
        monkeypatch.setattr(block_step, "ENABLED", False)
        plain = run(paged)
        monkeypatch.setattr(block_step, "ENABLED", True)
        torch.testing.assert_close(fused, plain, atol=2e-5, rtol=2e-5)
    half = run(False, torch.float16)  # the compiled attention reads fp32 and bf16 caches only
    assert mixes
    monkeypatch.setattr(block_step, "ENABLED", False)
    torch.testing.assert_close(half, run(False, torch.float16), atol=1e-2, rtol=1e-2)
    monkeypatch.setattr(block_step, "ENABLED", True)
    bidirectional = build_model(tiny(causal=False, dim=48)).eval()
    used = _count_steps(monkeypatch)
    _decode_logits(bidirectional, [[1, 2, 3]], 2)
    assert not any(used)


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
def test_prefill_attention_stays_out_where_it_does_not_apply():
    from attnlab.models.attention import compiled_prefill, sdpa_attention

    q, k, v = torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    with torch.no_grad():
        assert compiled_prefill(q.half(), k.half(), v.half(), 0.125) is None  # fp32 only
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

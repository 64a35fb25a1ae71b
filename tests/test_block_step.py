"""The engine's compiled decode step (engine/fast/block_step.py) computes the blocks' own forward: the plain model
(models/, the reference) and the same model behind an InferenceModel give the same logits, and the path counts
(kernels.paths) say which path each step took and why."""
import pytest
import torch

from attnlab import kernels
from attnlab.engine.fast import InferenceModel
from attnlab.engine.quantize import DenseLinear, Int8Linear, set_precision
from attnlab.kernels import paths
from attnlab.models import build_model
from attnlab.models.attention import Attention
from conftest import tiny

needs_kernel = pytest.mark.skipif(kernels.native() is None, reason="no C++ compiler or Python headers here")
COMPILED = ("block_decode", "block_pre_post")


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


def _counted(fn):
    """(fn()'s result, the block-step path counts it added)."""
    before = paths.snapshot()
    out = fn()
    return out, {k: v for k, v in paths.since(before).items() if k.startswith(("block", "decode_attention"))}


def _only_compiled(counts: dict) -> bool:
    return bool(counts) and all(k in COMPILED or k == "decode_attention" for k in counts)


@needs_kernel
def test_decode_steps_through_the_fused_kernel_match_the_library_kernel(monkeypatch):
    """A model decoding through its caches (contiguous, ragged, paged), with the compiled block step or with the
    fused decode attention under the blocks' forward, gives the tokens and logprobs of the library kernels."""
    from attnlab.engine.generate import generate

    torch.manual_seed(0)
    model = build_model(tiny(max_seq_len=128, n_kv_heads=2)).eval()
    prompts = [list(range(1, 20)), [5, 6, 7], list(range(30, 0, -1))]
    whole, counts = _counted(lambda: [generate(model, prompts, 10, paged=p) for p in (False, True)])
    assert counts.get("block_decode") and _only_compiled(counts), counts  # the engine wraps the plain model
    reference = InferenceModel(model, compiled=False)  # the blocks' forward, attention by fused_decode
    fused, counts = _counted(lambda: [generate(reference, prompts, 10, paged=p) for p in (False, True)])
    assert set(counts) == {"decode_attention"}, counts
    monkeypatch.setattr(kernels, "_state", {"native": None})  # the library kernels only
    monkeypatch.setattr(paths, "_announced", set())  # announced once per process: this test's own first
    with pytest.warns(RuntimeWarning, match="not used"):
        plain, counts = _counted(lambda: [generate(model, prompts, 10, paged=p) for p in (False, True)])
    assert "block step fallback: no compiled kernels here" in counts
    for ours in (whole, fused):
        for a, b in zip(ours, plain):
            assert [c.tokens for c in a.completions] == [c.tokens for c in b.completions]
            for x, y in zip(a.completions, b.completions):
                assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


@needs_kernel
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("layout", ["nn.Linear", "few_rows", "matmul"])
def test_the_compiled_block_step_computes_the_blocks_forward(arch, layout, monkeypatch):
    """Decode steps through block_step.cpp (norm + qkv; out projection + residual + norm + MLP + residual) give the
    logits of the plain model, for GPT-2's block (LayerNorm with bias, GELU, learned positions) and Llama's
    (RMSNorm, SwiGLU, RoPE, grouped-query), with weights as nn.Linear or DenseLinear in either layout the compiled
    step reads, on a ragged batch, through the contiguous and the paged cache."""
    cfg = (tiny(norm="layernorm", mlp="gelu", pos="learned", bias=True, dim=48, n_layers=3) if arch == "gpt2" else
           tiny(norm="rmsnorm", mlp="swiglu", pos="rope", n_kv_heads=2, dim=48, n_layers=3))
    model = build_model(cfg).eval()
    if layout == "nn.Linear":
        fast = InferenceModel(model)
    else:
        monkeypatch.setattr(DenseLinear, "_chosen", {k: layout for k in [
            (i, o, torch.float32, 1, b, False) for i, o in ((48, 144), (48, 96), (48, 48), (48, 192), (192, 48),
                                                             (48, 128), (128, 48), (48, 37)) for b in (False, True)]})
        fast = set_precision(model, "fp32")
    prompts = [list(range(1, 12)), [5, 6, 7], list(range(30, 10, -1))]
    mixes = []
    real_mix = Attention.mix
    monkeypatch.setattr(Attention, "mix", lambda self, *a: mixes.append(1) or real_mix(self, *a))
    for paged in (False, True):
        mixes.clear()
        fused, counts = _counted(lambda: _decode_logits(fast, prompts, 6, paged))
        assert counts == {"block_decode": 6 * cfg.n_layers}, counts  # every decode step of every block, one call
        assert len(mixes) == cfg.n_layers  # the prefill's only
        plain = _decode_logits(model, prompts, 6, paged)  # the plain model: each block's forward
        torch.testing.assert_close(fused, plain, atol=2e-5, rtol=2e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_the_compiled_block_step_with_narrow_weights_stays_close_to_the_forward(dtype, monkeypatch):
    """bf16 and int8 weights (bf16 activations, bf16 cache): the compiled step keeps its activations in fp32,
    so it differs from the forward (which rounds them to bf16) by bf16 rounding only."""
    class FewRows(dict):  # every Int8Linear on attnlab's kernel (its measurement may pick torch's int8 one)
        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            return "few_rows"
    monkeypatch.setattr(Int8Linear, "_chosen", FewRows())
    fast = set_precision(build_model(tiny(norm="rmsnorm", mlp="swiglu", dim=64, n_layers=2)).eval(), dtype)
    assert fast.cache_dtype == torch.bfloat16 and fast.new_state(1, 8).k[0].dtype == torch.bfloat16
    prompts = [list(range(1, 12)), [5, 6, 7]]
    fused, counts = _counted(lambda: _decode_logits(fast, prompts, 4))
    assert _only_compiled(counts), counts
    plain = _decode_logits(InferenceModel(fast.model, cache_dtype=torch.bfloat16, compiled=False), prompts, 4)
    assert (fused - plain).abs().max() < 0.05 * plain.abs().max()


@needs_kernel
def test_the_compiled_block_step_stays_out_where_it_does_not_apply():
    """ALiBi, a kernel under study, autograd (training) and a prefill-sized call run the blocks' forward; each is
    counted as such (not as a fallback), and the prefill (more than kernels.MAX_ROWS rows) not at all."""
    prompt = [list(range(1, kernels.MAX_ROWS + 2))]  # one row more than a decode-sized call
    for cfg, why in ((tiny(pos="alibi"), "ALiBi"), (tiny(kernel="naive"), "kernel under study")):
        _, counts = _counted(lambda: _decode_logits(InferenceModel(build_model(cfg).eval()), prompt, 2))
        assert counts == {f"block forward: {why}": 2 * cfg.n_layers}, counts
    fast = InferenceModel(build_model(tiny()).eval())
    state = fast.new_state(1, 32)

    def calls():
        fast(torch.tensor([[1, 2, 3]]), state)  # autograd on: a training-style call
        fast(torch.tensor([[4]]), state)
        with torch.inference_mode():
            fast(torch.tensor([list(range(1, 20))]), fast.new_state(1, 32))  # 19 rows: prefill-sized
    counts = _counted(calls)[1]
    assert not any(k.startswith("block") for k in counts), counts  # (the decode step's attention may be fused)


@needs_kernel
def test_a_weight_the_step_cannot_read_is_a_counted_fallback(monkeypatch):
    """A block whose weight sits in a packed layout (no step_operands) runs its forward, announced once and counted
    with the reason at every step; the result is the plain model's."""
    monkeypatch.setattr(paths, "_announced", set())  # announced once per process: this test's own first
    model = build_model(tiny(dim=32, n_layers=2)).eval()
    fast = InferenceModel(model)

    class Packed(torch.nn.Linear):  # a Linear the step does not know how to read
        pass
    old = model.backbone.blocks[1].mlp.w1
    packed = Packed(old.in_features, old.out_features, bias=old.bias is not None)
    packed.load_state_dict(old.state_dict())
    model.backbone.blocks[1].mlp.w1 = packed
    prompt = [list(range(1, kernels.MAX_ROWS + 2))]  # a prefill: not counted
    with pytest.warns(RuntimeWarning, match="block step not used"):
        fused, counts = _counted(lambda: _decode_logits(fast, prompt, 3))
    assert counts["block_decode"] == 3 and counts["block step fallback: a Packed weight, which has no "
                                                  "step_operands()"] == 3, counts
    torch.testing.assert_close(fused, _decode_logits(model, prompt, 3), atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_compiled_block_step_sees_swapped_modules():
    """The runner keeps each block's compiled arguments between steps; replacing one of its Linears (or a
    parameter) after a step is seen at the next one."""
    model = build_model(tiny(dim=32)).eval()
    fast = InferenceModel(model)
    _decode_logits(fast, [[1, 2, 3]], 1)  # plans kept
    blk = model.backbone.blocks[0]
    blk.attn.wo = torch.nn.Linear(32, 32, bias=False)
    blk.mlp.w2.weight = torch.nn.Parameter(torch.randn_like(blk.mlp.w2.weight))
    fused = _decode_logits(fast, [[1, 2, 3]], 2)
    torch.testing.assert_close(fused, _decode_logits(model, [[1, 2, 3]], 2), atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_compiled_block_step_sees_narrow_norm_weights_change_in_place():
    """A bf16 model's norm weights are widened once, when the plan is built; changing one in place, or swapping
    its data, after a step rebuilds the plan at the next one."""
    fast = set_precision(build_model(tiny(dim=32)).eval(), "bf16")
    _decode_logits(fast, [[1, 2, 3]], 1)  # plans kept, with fp32 copies of the norms' bf16 weights
    blk = fast.model.backbone.blocks[0]
    with torch.no_grad():
        blk.attn_norm.weight.mul_(3.0)
    blk.mlp_norm.weight.data = torch.randn_like(blk.mlp_norm.weight)
    fused = _decode_logits(fast, [[1, 2, 3]], 2)
    plain = _decode_logits(InferenceModel(fast.model, cache_dtype=fast.cache_dtype, compiled=False), [[1, 2, 3]], 2)
    assert (fused - plain).abs().max() < 0.05 * plain.abs().max()  # bf16 rounding apart, the same function
    _, widened = fast.runner.kept_plan(blk)
    assert widened and all(t.dtype == torch.bfloat16 for t, _ in widened)
    with torch.inference_mode():  # weights made as inference tensors have no version counter (cost --validate)
        inf_model = set_precision(build_model(tiny(dim=32)).eval(), "bf16")
        assert _decode_logits(inf_model, [[1, 2, 3]], 2).isfinite().all()


@needs_kernel
def test_the_block_steps_bf16_residual_is_widened_and_rounded_once_as_torch_converts_it():
    """block_pre and block_post widen a bf16 x (and attention output) in the call and round the block's output once:
    the same bits as handing them fp32 copies and converting the fp32 output with torch, whatever the layout."""
    fast = set_precision(build_model(tiny(dim=32)).eval(), "bf16")
    _decode_logits(fast, [[1, 2, 3]], 1)  # builds the plans
    pre, post = fast.runner.plan(fast.model.backbone.blocks[0])
    mod = kernels.native()
    torch.manual_seed(0)
    x = (torch.randn(3, 32) * 4).to(torch.bfloat16)
    attn = (torch.randn(32, 3) * 4).to(torch.bfloat16).t()  # (3, 32), not contiguous
    assert torch.equal(mod.block_pre(x, *pre), mod.block_pre(x.float(), *pre))
    got = mod.block_post(x, attn, *post)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, mod.block_post(x.float(), attn.float().contiguous(), *post).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="fp32 or bf16 activations"):
        mod.block_pre(x.to(torch.float16), *pre)


@needs_kernel
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_compiled_block_step_takes_several_new_tokens_a_row_causally(arch):
    """A few new tokens per row in one call (a short prefill, a speculative verification's k + 1), through one
    compiled call a block: each new token sees the cache and the new tokens before it, not after."""
    cfg = (tiny(norm="layernorm", mlp="gelu", pos="learned", bias=True, dim=48) if arch == "gpt2" else
           tiny(norm="rmsnorm", mlp="swiglu", pos="rope", n_kv_heads=2, dim=48))
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    chunks = [torch.randint(1, 37, (2, n), generator=g) for n in (5, 3, 4, 1)]  # 2 rows x 5 tokens: 10 rows

    def run(m, paged):
        state = m.new_state(2, 32, paged=paged, block_size=4)
        with torch.inference_mode():
            return torch.cat([m(c, state)[0] for c in chunks], dim=1)
    for paged in (False, True):
        fused, counts = _counted(lambda: run(InferenceModel(model), paged))
        assert _only_compiled(counts), counts
        torch.testing.assert_close(fused, run(model, paged), atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_compiled_block_step_with_rows_at_different_positions_and_what_it_leaves_alone(monkeypatch):
    """Rows at different positions taking 3 new tokens each go through one call a block (each row's own slots);
    an fp16 cache and a non-causal model are left to the blocks' forward, with its results."""
    model = build_model(tiny(pos="rope", n_kv_heads=2, dim=48)).eval()
    fast = InferenceModel(model)
    mixes = []
    real_mix = Attention.mix
    monkeypatch.setattr(Attention, "mix", lambda self, *a: mixes.append(1) or real_mix(self, *a))

    def run(m, paged, dtype=None):
        state = m.new_state(2, 32, paged=paged, block_size=4, dtype=dtype)
        with torch.inference_mode():
            m(torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]), state, lengths=torch.tensor([5, 2]))
            mixes.clear()  # the ragged prefill (filler in row 2) attends in Python; what follows is all real
            return torch.cat([m(torch.tensor([[3, 4, 5], [7, 8, 9]]), state)[0] for _ in range(2)], dim=1)
    for paged in (False, True):
        fused = run(fast, paged)
        assert not mixes  # one compiled call a block
        torch.testing.assert_close(fused, run(model, paged), atol=2e-5, rtol=2e-5)
    half, counts = _counted(lambda: run(fast, False, torch.float16))  # the compiled attention: fp32, bf16 caches
    assert mixes and counts.get("block_pre_post"), counts
    torch.testing.assert_close(half, run(model, False, torch.float16), atol=1e-2, rtol=1e-2)
    bidirectional = InferenceModel(build_model(tiny(causal=False, dim=48)).eval())
    _, counts = _counted(lambda: _decode_logits(bidirectional, [[1, 2, 3]], 2))
    blocks = {k: v for k, v in counts.items() if k.startswith("block")}
    assert blocks == {"block forward: kernel under study": 3 * 2}, counts  # the prefill (3 rows) and 2 steps


def test_set_precision_returns_a_wrapper_and_leaves_the_model_plain():
    """set_precision hands back an InferenceModel that owns precision, rows and the cache dtype; the model inside
    carries none of them, so models/ never reads an engine field."""
    model = build_model(tiny(dim=32)).eval()
    fast = set_precision(model, "bf16", rows=4)
    assert isinstance(fast, InferenceModel) and fast.model is model and fast.cfg is model.cfg
    assert (fast.precision, fast.rows) == ("bf16", 4)
    assert not any(hasattr(model, a) for a in ("precision", "rows", "cache_dtype"))
    assert set_precision(fast, "fp32").model is model  # a wrapper is unwrapped, not nested
    with pytest.raises(TypeError, match="already an InferenceModel"):
        InferenceModel(fast)

"""The inference engine: batching, caching, sampling, stopping, streaming, prefix reuse, precision."""
import math

import pytest
import torch

from attnlab import kernels
from attnlab.data.tokenizers import ByteTokenizer
from attnlab.engine import SamplingParams, generate
from attnlab.engine.engine import Engine, EngineConfig
from attnlab.engine.quantize import DenseLinear, Int8Linear, set_precision
from attnlab.errors import AttnlabError
from attnlab.models import build_model
from conftest import FAMILIES, tiny


def lively(**kw):
    """A random model whose greedy output is not just 'repeat the last token' (untied, larger init)."""
    return build_model(tiny(tie_embeddings=False, init_std=0.2, **kw)).eval()


PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_equals_one_by_one(family):
    model = lively(family=family)
    batch = generate(model, PROMPTS, 8)
    for prompt, comp in zip(PROMPTS, batch.completions):
        assert comp.tokens == generate(model, prompt, 8).tokens


@pytest.mark.parametrize("kw", [dict(pos="learned"), dict(pos="sinusoidal"), dict(pos="alibi", kernel="naive"),
                                dict(n_kv_heads=2, mlp="swiglu", norm="rmsnorm")])
def test_padding_is_masked_for_every_encoding(kw):
    model = lively(**kw)
    batch = generate(model, PROMPTS, 6)
    assert [c.tokens for c in batch.completions] == [generate(model, p, 6).tokens for p in PROMPTS]


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decode_equals_full_recompute(family):
    model = lively(family=family)
    cached, fresh = generate(model, PROMPTS, 10), generate(model, PROMPTS, 10, use_cache=False)
    assert [c.tokens for c in cached.completions] == [c.tokens for c in fresh.completions]
    for a, b in zip(cached.completions, fresh.completions):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_logprobs_are_the_models_own():
    model = lively()
    out = generate(model, [3, 4, 5], 5)
    seq = torch.tensor([[3, 4, 5] + out.tokens])
    logp = torch.log_softmax(model(seq)[0][0], -1).detach()
    expected = [float(logp[2 + i, t]) for i, t in enumerate(out.tokens)]
    assert out.completions[0].logprobs == pytest.approx(expected, abs=1e-4)


def test_bf16_cache_stays_close_to_fp32():
    model = lively()
    a = generate(model, [1, 2, 3], 6)
    b = generate(model, [1, 2, 3], 6, cache_dtype=torch.bfloat16)
    assert b.stats.state_bytes * 2 == a.stats.state_bytes
    assert sum(x == y for x, y in zip(a.tokens, b.tokens)) >= 4


def test_fp32_cache_under_bf16_weights_attends_in_fp32():
    """The wider cache is kept as it is (the new queries are widened instead) and the block stays in bf16."""
    import copy
    model = lively(dim=64, n_heads=4)
    fast = set_precision(copy.deepcopy(model), "bf16")
    x = torch.randint(0, 37, (1, 9))
    state = fast.new_state(1, 16, dtype=torch.float32)
    logits, _ = fast(x, state)
    assert state.k[0].dtype == torch.float32 and logits.dtype == torch.bfloat16
    ref = model(x)[0]
    assert (logits.float() - ref).abs().max() <= 0.05 * ref.abs().max()
    step, _ = fast(torch.tensor([[4]]), state)  # decode: one widened query against the fp32 cache
    assert step.dtype == torch.bfloat16 and torch.isfinite(step.float()).all()


def test_stop_token():
    model = lively(vocab_size=256)
    base = generate(model, [65, 66, 67], 12).tokens
    stopped = generate(model, [65, 66, 67], 12, stop_tokens=[base[3]])
    assert stopped.tokens == base[:base.index(base[3]) + 1] and stopped.completions[0].finish_reason == "stop"
    assert generate(model, [65, 66, 67], 12).completions[0].finish_reason == "length"


def test_stop_string_is_cut_from_the_text():
    model = lively(vocab_size=256)
    tok = ByteTokenizer()
    base = generate(model, list(b"hello"), 30).tokens
    # the first pair of consecutive ASCII bytes that has not appeared before becomes the stop string
    i = next(i for i in range(1, len(base) - 1) if base[i] < 128 and base[i + 1] < 128
             and bytes(base[i:i + 2]) not in bytes(base[:i + 1]))
    stop = bytes(base[i:i + 2]).decode()
    out = generate(model, list(b"hello"), 30, stop_strings=[stop], tokenizer=tok).completions[0]
    assert out.finish_reason == "stop" and out.tokens == base[:i + 2]
    assert out.text == tok.decode_text(base[:i])


def test_sampling_is_seeded_and_top_k1_is_greedy():
    model = lively()
    p = SamplingParams(temperature=1.0, seed=7)
    assert generate(model, [1, 2], 10, p).tokens == generate(model, [1, 2], 10, p).tokens
    assert generate(model, [1, 2], 10, SamplingParams(temperature=1.0, seed=8)).tokens != \
        generate(model, [1, 2], 10, p).tokens
    greedy = generate(model, [1, 2], 10).tokens
    assert generate(model, [1, 2], 10, SamplingParams(temperature=1.5, top_k=1, seed=3)).tokens == greedy
    assert generate(model, [1, 2], 10, SamplingParams(temperature=1.5, top_p=1e-6, seed=3)).tokens == greedy


def test_greedy_rows_pick_the_first_maximum_its_log_probability_and_flag_every_non_finite_row():
    from attnlab.engine.sampling import greedy_rows

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g)
    logits[1, 7] = logits[1, 200] = logits[1].max() + 1  # a tie: the first one, as argmax
    logits[2, 3], logits[3, 9], logits[4, 0] = math.nan, math.inf, -math.inf
    logits[5] = -math.inf
    finite, ids, lps = greedy_rows(logits.to(torch.bfloat16).float())
    rows = logits.to(torch.bfloat16).float()
    assert finite == [True, True, False, False, False, False]
    assert ids[:2] == rows[:2].argmax(-1).tolist() and ids[1] == 7
    want = torch.log_softmax(rows[:2], -1).gather(1, torch.tensor(ids[:2])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(lps[:2]), want, atol=1e-6)


def test_repetition_penalty_discourages_repeats():
    model = build_model(tiny()).eval()  # tied + tiny init: greedy repeats the last token forever
    plain = generate(model, [5], 8).tokens
    assert len(set(plain)) == 1
    penalised = generate(model, [5], 8, SamplingParams(repetition_penalty=5.0)).tokens
    assert len(set(penalised)) > 1


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-1), "temperature=-1 must be >= 0"), (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), "top_p=1.5"), (dict(top_k=-2), "top_k=-2 must be >= 0"),
    (dict(repetition_penalty=0), "repetition_penalty=0")])
def test_bad_sampling_params(kw, match):
    with pytest.raises(AttnlabError, match=match):
        SamplingParams(**kw)


def test_bad_requests_name_the_numbers():
    model = lively()  # max_seq_len 64
    with pytest.raises(AttnlabError, match="prompt is empty"):
        generate(model, [], 4)
    with pytest.raises(AttnlabError, match="max_new_tokens=0 must be > 0"):
        generate(model, [1], 0)
    with pytest.raises(AttnlabError, match="max_new_tokens=64 leaves no room"):
        generate(model, [1], 64)
    with pytest.raises(AttnlabError, match="prompt of 60 tokens \\+ max_new_tokens 10 exceeds the model's context of 64"):
        generate(model, [1] * 60, 10)
    out = generate(model, list(range(1, 31)) * 2, 10, truncate="left")
    assert out.stats.prompt_tokens == 54
    with pytest.raises(AttnlabError, match="outside the model's vocabulary"):
        generate(model, [1, 99], 2)


@pytest.mark.parametrize("kind", ["transformer", "gru", "sliding"])
def test_engine_stream_equals_generate_and_reuses_prefixes(kind):
    kw = dict(kernel="sliding", window=16) if kind == "sliding" else dict(family=kind)
    model = lively(vocab_size=256, max_seq_len=128, **kw)
    tok = ByteTokenizer()
    engine = Engine(model, EngineConfig(), tok)
    first = list(b"def f(x):")
    events = list(engine.stream(first, 12))
    ref = generate(model, first, 12, tokenizer=tok)
    assert [e.token for e in events] == ref.tokens
    assert "".join(e.text for e in events) == ref.completions[0].text == events[-1].result.text
    assert events[-1].result.cached_tokens == 0
    follow = first + [e.token for e in events] + list(b" return")  # a chat turn: history + new text
    again = engine.generate(follow, 8)
    assert again.tokens == generate(model, follow, 8).tokens
    assert again.stats.reused_prefix_tokens == len(first) + 11  # all but the last sampled token
    other = engine.generate(list(b"def g(y):"), 5)  # shares only "def " with what the engine holds
    assert other.tokens == generate(model, list(b"def g(y):"), 5).tokens
    expected = 4 if kind == "transformer" else 0  # a recurrent state or a ring cannot forget the rest
    assert other.stats.reused_prefix_tokens == expected


def test_dense_and_int8_linears():
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(5, 64)
    torch.testing.assert_close(DenseLinear(lin, torch.float32)(x), lin(x), atol=1e-5, rtol=1e-5)
    q = Int8Linear(lin, torch.bfloat16)
    assert q.weight.dtype == torch.int8
    # half a quantization step, plus the bf16 rounding of the per-channel scale (8 mantissa bits)
    amax = lin.weight.abs().amax()
    assert (q.dequantized - lin.weight).abs().max() <= amax / 127 * 0.51 + amax * 2 ** -8
    y = q(x.bfloat16()).float()
    assert (y - lin(x)).abs().max() < 0.05 * lin(x).abs().max()


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float32])
def test_int8_linear_many_rows_widen_the_weight_and_agree_with_int8pack(act, monkeypatch, int8_many_path):
    """From MANY_ROWS rows (a prefill) on the ``widen`` path the int8 weight is widened and scaled for a dense GEMM:
    the product equals the dequantized weight's to within the activations' rounding, and int8pack's (the path below
    MANY_ROWS) alike."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 384)
    int8_many_path("widen")
    q = Int8Linear(lin, torch.bfloat16)
    assert not hasattr(q, "weight_in_out")  # the integer path's copy is kept only where it runs
    rows = Int8Linear.MANY_ROWS
    x = torch.randn(3, rows, 256).to(act)  # (B, T, in): the forward flattens and restores the leading dims
    exact = x.float() @ q.dequantized.T + q.bias.float()
    many = q(x)
    assert many.shape == (3, rows, 384) and many.dtype == act
    ulp = 2 ** -7 if act == torch.bfloat16 else 1e-5  # two bf16 roundings at most (the dequantized weight, the product)
    assert (many.float() - exact).abs().max() <= ulp * exact.abs().max()
    monkeypatch.setattr(Int8Linear, "MANY_ROWS", 10 ** 9)  # the same call through int8pack / the compiled kernel
    few = q(x)
    assert (many.float() - few.float()).abs().max() <= 2 * ulp * exact.abs().max()


@pytest.mark.parametrize("act", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_many_rows_as_integers_is_within_the_activations_rounding(act, bias, int8_many_path):
    """The ``w8a8`` path quantizes each row of activations to int8 (step s_r = max|x[r]| / 127, rounded to the
    nearest) and multiplies integers: it equals that arithmetic emulated in float64 to within fp32's roundings of
    the scaling and one rounding to the activations' dtype (truncating instead of rounding, or a wrong scale, would
    not); each output is within half a step times the weight row's absolute sum of the dequantized weight's exact
    product; a row of zeros gives the bias alone; about 1% of a product on random rows, against widen's 0.3%."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(320, 192, bias=bias)
    int8_many_path("w8a8")
    q = Int8Linear(lin, torch.bfloat16)
    assert q.many == {"batch": "w8a8", "prompt": "w8a8"} and q.weight_in_out.shape == (320, 192)
    x = torch.randn(2, 40, 320).to(act) * torch.logspace(-3, 2, 40)[None, :, None].to(act)  # rows of every scale
    x[1, 7] = 0
    exact = x.double() @ q.dequantized.double().T + (q.bias.double() if bias else 0)  # (2, 40, 192)
    got = q(x)
    assert got.shape == (2, 40, 192) and got.dtype == act
    step = x.double().abs().amax(-1, keepdim=True) / 127  # (2, 40, 1)
    bound = step / 2 * q.dequantized.double().abs().sum(1) + torch.finfo(act).eps * exact.abs() + 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    assert torch.equal(got[1, 7].double(), exact[1, 7])  # a zero row is the bias alone (or zero)
    rel = (got.double() - exact).norm() / exact.norm()
    assert rel < 0.01  # 0.6-0.7% expected on random rows: step / sqrt(12) against a row's spread
    xf = x.float()  # the emulation: the same fp32 step, the same rounding, then exact arithmetic
    s = xf.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    emulated = (torch.div(xf, s).round().double() @ q.weight.double().T) * s.double() * q.scale.double()
    emulated = emulated + (q.bias.double() if bias else 0)
    slack = (torch.finfo(act).eps + 4 * 2 ** -24) * (emulated.abs() + (q.bias.double().abs() if bias else 0))
    assert ((got.double() - emulated).abs() <= slack + 1e-12).all()


def test_int8_linear_w8a8_gives_the_same_bits_with_the_compiled_ends_or_torchs_ops(int8_many_path, monkeypatch):
    """Where the kernels build, w8a8 quantizes and scales in kernels/int8_rows.cpp; elsewhere torch's ops do the
    same arithmetic: both give the same bits, and both send a row with a NaN to the widened product."""
    from attnlab.engine import quantize

    if quantize.kernels.native() is None:
        pytest.skip("no compiled kernels here: the torch ops are the only path")
    torch.manual_seed(0)
    int8_many_path("w8a8")
    for act, bias in ((torch.bfloat16, True), (torch.float32, False)):
        q = Int8Linear(torch.nn.Linear(200, 72, bias=bias), act)
        x = (torch.randn(50, 200) * torch.logspace(-2, 2, 50)[:, None]).to(act)
        compiled = q(x)
        x_nan = x.clone()
        x_nan[4, 4] = float("nan")
        compiled_nan = q(x_nan)
        with monkeypatch.context() as m:
            m.setattr(quantize.kernels, "native", lambda: None)
            assert torch.equal(compiled, q(x))
            assert torch.equal(compiled_nan.isnan(), q(x_nan).isnan()) and compiled_nan[4].isnan().all()


def test_int8_linear_w8a8_passes_inf_and_nan_on_as_a_float_product_does(int8_many_path):
    """A row holding an inf or a NaN has no integer step: w8a8 hands such a call to the widened product, which
    passes them on as any float model does (NaN where a NaN or inf times a weight reaches an output), and leaves
    the finite rows of the same call as the widened product computes them."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    int8_many_path("w8a8")
    q = Int8Linear(lin, torch.bfloat16)
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    x[3, 5], x[9, 0] = float("inf"), float("nan")
    got = q(x)
    widened = q._many_rows("widen", x)
    assert torch.equal(got.isnan(), widened.isnan()) and got[9].isnan().all() and not got[3].isfinite().any()
    finite = torch.ones(40, dtype=torch.bool)
    finite[[3, 9]] = False
    assert torch.equal(got[finite], widened[finite])


def test_int8_linear_keeps_no_integer_copy_where_widen_runs(int8_many_path):
    """The (in, out) int8 copy that w8a8 reads is made only where w8a8 runs: a matrix whose choice is widen for
    every kind of call, measured before or just now, holds its int8 weight once."""
    lin = torch.nn.Linear(64, 48)
    int8_many_path("widen")
    assert not hasattr(Int8Linear(lin, torch.bfloat16), "weight_in_out")
    int8_many_path("w8a8")
    assert Int8Linear(lin, torch.bfloat16).weight_in_out.shape == (64, 48)


@pytest.mark.parametrize("path", ["matmul", "onednn", "mkl", "mv"])
@pytest.mark.parametrize("rows", [1, 4, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_every_dense_linear_layout_for_any_row_count_computes_the_same(path, rows, bias, monkeypatch):
    """Whichever layout is chosen and whatever row count it is laid out for, every call size gives
    nn.Linear's result."""
    lin = torch.nn.Linear(512, 640, bias=bias)
    forced = {(512, 640, torch.float32, rows, bias, False): path}
    monkeypatch.setattr(DenseLinear, "_chosen", forced)  # skip the measurement: install this layout
    dense = DenseLinear(lin, torch.float32, rows)
    if dense.path != path:
        pytest.skip(f"{path} is not built into this torch, or not a candidate for {rows} rows")
    for m in (1, 2, 5, 64):
        x = torch.randn(m, 512)
        torch.testing.assert_close(dense(x), lin(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(AttnlabError, match="rows=0"):
        set_precision(lively(dim=64, n_heads=4), "fp32", rows=0)


def test_dense_linear_keeps_the_fastest_layout_it_measured(monkeypatch):
    monkeypatch.setattr(DenseLinear, "_chosen", {})
    lin = torch.nn.Linear(256, 384)
    dense = DenseLinear(lin, torch.float32, 2)
    # 2 rows <= COLD_ROWS: timed with the weights flushed from the caches, where the compiled kernels can flush them;
    # the packed layouts (opaque, nothing to flush) then do not compete
    cold = kernels.native() is not None
    assert dense.path in (("matmul", "mv", "few_rows") if cold else ("matmul", "onednn", "mkl", "mv"))
    assert DenseLinear._chosen[(256, 384, torch.float32, 2, True, False)] == dense.path  # measured once per shape
    assert weight_bytes_of(dense) == 256 * 384 * 4 + 384 * 4  # one dense copy counted, whatever the layout


def test_dense_linear_for_varying_batches_picks_a_layout_valid_at_every_row_count(monkeypatch):
    monkeypatch.setattr(DenseLinear, "_chosen", {})
    lin = torch.nn.Linear(256, 384)
    dense = DenseLinear(lin, torch.float32, 16, varying=True)
    # mkl's packing serves exactly 16 rows, mv exactly one; with the compiled kernels (16 rows <= COLD_ROWS)
    # oneDNN's packing does not compete
    assert dense.path in (("matmul", "few_rows") if kernels.native() is not None else ("matmul", "onednn"))
    for m in (1, 3, 16, 40):
        x = torch.randn(m, 256)
        torch.testing.assert_close(dense(x), lin(x), atol=1e-4, rtol=1e-4)


def weight_bytes_of(module):
    from attnlab.engine.quantize import weight_bytes

    return weight_bytes(module)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_precisions_keep_the_model(dtype):
    model = lively(dim=64, n_heads=4)
    x = torch.randint(0, 37, (2, 12))
    ref = model(x)[0]
    import copy
    fast = set_precision(copy.deepcopy(model), dtype)
    out = fast(x)[0].float()
    tol = {"fp32": 1e-4, "bf16": 0.05, "int8": 0.08}[dtype]
    assert (out - ref).abs().max() <= tol * ref.abs().max()
    assert generate(fast, [1, 2, 3], 4).tokens  # and it still decodes through the contract


def test_sample_continuations_are_prompts_from_the_text_and_greedy_continuations():
    from attnlab.engine.generate import sample_continuations

    model = lively(dim=64, n_heads=4)
    ids = torch.randint(0, 37, (400,), generator=torch.Generator().manual_seed(3))
    seqs = sample_continuations(model, ids, n=5, prompt_len=12, new_tokens=6, seed=4, batch=2)  # a partial batch
    assert len(seqs) == 5 and all(len(s) == 18 for s in seqs)
    text = ids.tolist()
    for s in seqs:
        prompt = s[:12]
        assert any(text[i:i + 12] == prompt for i in range(len(text) - 11))
        assert s[12:] == generate(model, prompt, 6).tokens
    assert sample_continuations(model, ids, 5, 12, 6, seed=4, batch=5) == seqs  # seeded; batching changes nothing
    hot = SamplingParams(temperature=1.0, seed=9)
    sampled = sample_continuations(model, ids, 5, 12, 6, seed=4, batch=2, params=hot)
    assert sample_continuations(model, ids, 5, 12, 6, seed=4, batch=5, params=hot) == sampled
    for i, s in enumerate(sampled):  # row i draws with seed 9 + i, as it would alone
        assert s[12:] == generate(model, s[:12], 6, SamplingParams(temperature=1.0, seed=9 + i)).tokens


def test_generate_takes_one_sampling_setting_per_prompt():
    model = lively(dim=64, n_heads=4)
    per = [SamplingParams(temperature=1.0, seed=s) for s in (0, 1, 2)]
    together = generate(model, [[1, 2, 3]] * 3, 8, per).completions
    alone = [generate(model, [1, 2, 3], 8, p).tokens for p in per]
    assert [c.tokens for c in together] == alone and len({tuple(a) for a in alone}) > 1  # the seeds differ
    assert [c.tokens for c in generate(model, [[1, 2, 3]] * 3, 8, per, use_cache=False).completions] == alone
    with pytest.raises(AttnlabError, match="2 sampling settings for 3 prompts"):
        generate(model, [[1, 2, 3]] * 3, 8, per[:2])


@pytest.mark.parametrize("family", ["transformer", "gru", "linear"])
def test_engine_without_prefix_reuse_recomputes_every_turn(family):
    """prefix_reuse=False (claim 12's baseline): same outputs, nothing taken from a cache."""
    model = lively(family=family, dim=64, n_heads=4)
    engine = Engine(model, EngineConfig(prefix_reuse=False))
    first = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    a = engine.generate(first, 6)
    follow = first + a.tokens + [3, 4]
    b = engine.generate(follow, 6)
    assert a.tokens == generate(model, first, 6).tokens and b.tokens == generate(model, follow, 6).tokens
    assert a.stats.reused_prefix_tokens == b.stats.reused_prefix_tokens == 0

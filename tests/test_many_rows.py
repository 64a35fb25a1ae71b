"""engine/many_rows: the library GEMM of prefill-sized inference products, chosen by measurement, gives
F.linear's result on every path, layout and dtype, and a DenseLinear of any layout reads it above its few rows."""
import pytest
import torch
import torch.nn.functional as F

from attnlab.engine import many_rows
from attnlab.engine.quantize import DenseLinear, Int8Linear


@pytest.mark.parametrize("path", many_rows.PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("transposed", [False, True])
def test_every_path_computes_f_linear(path, dtype, bias, transposed):
    if path not in many_rows.candidates(torch.empty(1, 1, dtype=dtype)):
        pytest.skip(f"{path} cannot run {dtype} in this torch build")
    torch.manual_seed(0)
    w = torch.randn(320, 256).to(dtype)
    if transposed:  # DenseLinear's (in, out) layout, handed over as its (out, in) view
        w = w.t().contiguous().t()
    b = torch.randn(320).to(dtype) if bias else None
    x = torch.randn(100, 256).to(dtype)
    with torch.inference_mode():
        got = many_rows.linear(path, x, w, b)
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    assert got.shape == (100, 320) and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7  # bf16: the output's own rounding
    assert (got.double() - exact).abs().max() <= tol * exact.abs().max()


def test_the_choice_is_a_candidate_measured_once_per_shape(monkeypatch):
    monkeypatch.setattr(many_rows, "_chosen", {})
    w = torch.randn(384, 256)
    path = many_rows.choose(w, None)
    assert path in many_rows.candidates(w)
    assert many_rows._chosen == {(256, 384, torch.float32, False, False, "prompt"): path}
    batch = many_rows.choose(w, None, 40)  # a batch's decode step: chosen apart, at its own row count
    assert many_rows._chosen[(256, 384, torch.float32, False, False, "batch")] == batch and len(many_rows._chosen) == 2
    calls = []
    monkeypatch.setattr(many_rows, "linear", lambda *a: calls.append(a))
    assert many_rows.choose(torch.randn(384, 256), None) == path and not calls  # remembered, not timed again
    assert many_rows.choose(torch.randn(384, 256), None, many_rows.BATCH_MAX) == batch and not calls
    assert [many_rows.bucket(n) for n in (17, many_rows.BATCH_MAX, many_rows.BATCH_MAX + 1)] == ["batch", "batch",
                                                                                                  "prompt"]


def test_a_path_that_fails_here_is_not_chosen(monkeypatch):
    monkeypatch.setattr(many_rows, "_chosen", {})
    real = many_rows.linear

    def onednn_fails(path, *args):
        if path == "onednn":
            raise RuntimeError("no oneDNN kernel for this shape")
        return real(path, *args)

    monkeypatch.setattr(many_rows, "linear", onednn_fails)
    assert many_rows.choose(torch.randn(64, 32), torch.randn(64)) == "linear"


def test_a_call_autograd_records_runs_f_linear():
    """oneDNN's op has no backward: with gradients wanted, the product is F.linear's, and differentiable."""
    w = torch.randn(48, 32)
    x = torch.randn(40, 32, requires_grad=True)
    y = many_rows.linear("onednn", x, w, None)
    y.sum().backward()
    torch.testing.assert_close(x.grad, w.sum(0).expand(40, 32))


@pytest.mark.parametrize("layout", ["matmul", "few_rows", "mv", "mkl", "onednn"])
@pytest.mark.parametrize("many", many_rows.PATHS)
@pytest.mark.parametrize("bias", [False, True])
def test_a_dense_linear_of_any_layout_reads_the_chosen_gemm_above_its_rows(layout, many, bias, monkeypatch):
    lin = torch.nn.Linear(256, 320, bias=bias)
    monkeypatch.setattr(DenseLinear, "_chosen", {(256, 320, torch.float32, 1, bias, False): layout})
    other = next(p for p in many_rows.PATHS if p != many)  # the prompt's choice, unlike the batch's
    key = (256, 320, torch.float32, bias, layout == "matmul")
    monkeypatch.setattr(many_rows, "_chosen", {(*key, "batch"): many, (*key, "prompt"): other})
    dense = DenseLinear(lin, torch.float32)
    if dense.path != layout:
        pytest.skip(f"{layout} is not built into this torch, or not a candidate here")
    # a oneDNN-packed weight stays oneDNN's
    assert dense.many_paths == ({"batch": "onednn", "prompt": "onednn"} if layout == "onednn" else
                                {"batch": many, "prompt": other})
    calls = []
    real = many_rows.linear
    monkeypatch.setattr(many_rows, "linear", lambda path, *a: calls.append(path) or real(path, *a))
    with torch.inference_mode():
        for m in (1, 16, 17, 200):
            x = torch.randn(m, 256)
            torch.testing.assert_close(dense(x), lin(x), atol=1e-4, rtol=1e-4)
    assert calls == ([] if layout == "onednn" else [many, other])  # the 17- and 200-row calls, not the few-row ones


def test_int8_prefill_widens_through_the_chosen_gemm(monkeypatch, int8_many_path):
    lin = torch.nn.Linear(256, 320)
    int8_many_path("widen")
    q = Int8Linear(lin, torch.float32)
    calls = []
    real = many_rows.linear
    monkeypatch.setattr(many_rows, "linear", lambda path, *a: calls.append(path) or real(path, *a))
    x = torch.randn(Int8Linear.MANY_ROWS, 256)
    with torch.inference_mode():
        y = q(x)
    torch.testing.assert_close(y, F.linear(x, q.dequantized, q.bias), atol=1e-4, rtol=1e-4)
    assert len(calls) == 1 and calls[0] in many_rows.PATHS

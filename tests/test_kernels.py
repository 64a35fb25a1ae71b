"""attnlab's compiled few-rows linear kernel (attnlab/kernels): results, batch invariance, the fallback."""
import subprocess
import sys

import pytest
import torch

from attnlab import kernels
from attnlab.engine.quantize import DenseLinear, Int8Linear

few_rows = kernels.few_rows()
needs_kernel = pytest.mark.skipif(few_rows is None, reason="no C++ compiler or Python headers here: the kernel cannot build")
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
        y = few_rows.linear(x, wb, NONE, NONE)
        torch.testing.assert_close(y, x @ wb.float().t(), atol=1e-4, rtol=1e-4)
        y32 = few_rows.linear(x, w, NONE, bias)
        torch.testing.assert_close(y32, x @ w.t() + bias, atol=1e-4, rtol=1e-4)
        assert torch.equal(y32, torch.cat([few_rows.linear(x[i:i + 1], w, NONE, bias) for i in range(m)]))
        yq = few_rows.linear(x, q, scale, bias)
        torch.testing.assert_close(yq, x @ (q.float() * scale[:, None]).t() + bias, atol=1e-4, rtol=1e-4)
        # every (row, channel) is the same sum in the same order, whatever rows share the call (rows go 4, 2, 1)
        assert torch.equal(y, torch.cat([few_rows.linear(x[i:i + 1], wb, NONE, NONE) for i in range(m)]))
        assert torch.equal(yq, torch.cat([few_rows.linear(x[i:i + 1], q, scale, bias) for i in range(m)]))
    xb = torch.randn(3, k, generator=g).to(torch.bfloat16)  # bf16 activations in, bf16 out (rounded once)
    yb = few_rows.linear(xb, wb, NONE, NONE)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, (xb.float() @ wb.float().t()).to(torch.bfloat16), atol=0, rtol=2 ** -7)


@needs_kernel
def test_few_rows_linear_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="x \\(M, K\\) and w \\(N, K\\)"):
        few_rows.linear(torch.randn(2, 8), torch.randn(4, 9).to(torch.bfloat16), NONE, NONE)
    with pytest.raises(RuntimeError, match="fp32, bf16 or int8"):
        few_rows.linear(torch.randn(2, 8), torch.randn(4, 8).half(), NONE, NONE)
    with pytest.raises(RuntimeError, match="one entry per output channel"):
        few_rows.linear(torch.randn(2, 8), torch.randn(4, 8).to(torch.bfloat16), torch.ones(3), NONE)


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
            "assert kernels.few_rows() is None; lin = torch.nn.Linear(32, 16);"
            "q = Int8Linear(lin, torch.bfloat16); d = DenseLinear(lin, torch.bfloat16);"
            "assert q.path == 'int8pack' and d.path != 'few_rows', (q.path, d.path);"
            "x = torch.randn(2, 32).bfloat16(); q(x); d(x); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "ATTNLAB_KERNELS": "0"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

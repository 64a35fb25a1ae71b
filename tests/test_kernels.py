"""attnlab's compiled low-precision linear kernel (attnlab/kernels): results, batch invariance, the fallback."""
import subprocess
import sys

import pytest
import torch

from attnlab import kernels
from attnlab.engine.quantize import DenseLinear, Int8Linear

lowp = kernels.lowp()
needs_kernel = pytest.mark.skipif(lowp is None, reason="no C++ compiler or Python headers here: the kernel cannot build")
NONE = torch.empty(0)


@needs_kernel
@pytest.mark.parametrize("n, k", [(24, 40), (29, 768), (7, 5), (64, 3072)])  # tails in channels (n % 4), lanes (k % 16)
def test_lowp_linear_matches_fp32_arithmetic_and_a_batch_equals_each_row_alone(n, k):
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g)
    wb = w.to(torch.bfloat16)
    scale = w.abs().amax(1) / 127
    q = (w / scale[:, None]).round().to(torch.int8)
    bias = torch.randn(n, generator=g)
    for m in (1, 2, 3, 5, 8, 16):
        x = torch.randn(m, k, generator=g)
        y = lowp.lowp_linear(x, wb, NONE, NONE)
        torch.testing.assert_close(y, x @ wb.float().t(), atol=1e-4, rtol=1e-4)
        yq = lowp.lowp_linear(x, q, scale, bias)
        torch.testing.assert_close(yq, x @ (q.float() * scale[:, None]).t() + bias, atol=1e-4, rtol=1e-4)
        # every (row, channel) is the same sum in the same order, whatever rows share the call (rows go 4, 2, 1)
        assert torch.equal(y, torch.cat([lowp.lowp_linear(x[i:i + 1], wb, NONE, NONE) for i in range(m)]))
        assert torch.equal(yq, torch.cat([lowp.lowp_linear(x[i:i + 1], q, scale, bias) for i in range(m)]))
    xb = torch.randn(3, k, generator=g).to(torch.bfloat16)  # bf16 activations in, bf16 out (rounded once)
    yb = lowp.lowp_linear(xb, wb, NONE, NONE)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, (xb.float() @ wb.float().t()).to(torch.bfloat16), atol=0, rtol=2 ** -7)


@needs_kernel
def test_lowp_linear_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="x \\(M, K\\) and w \\(N, K\\)"):
        lowp.lowp_linear(torch.randn(2, 8), torch.randn(4, 9).to(torch.bfloat16), NONE, NONE)
    with pytest.raises(RuntimeError, match="bf16 or int8"):
        lowp.lowp_linear(torch.randn(2, 8), torch.randn(4, 8), NONE, NONE)
    with pytest.raises(RuntimeError, match="one entry per output channel"):
        lowp.lowp_linear(torch.randn(2, 8), torch.randn(4, 8).to(torch.bfloat16), torch.ones(3), NONE)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_linears_on_the_kernel_give_the_library_paths_results(bias, monkeypatch):
    lin = torch.nn.Linear(96, 40, bias=bias)
    monkeypatch.setattr(DenseLinear, "_chosen", {(96, 40, torch.bfloat16, 4, bias, False): "lowp"})
    dense = DenseLinear(lin, torch.bfloat16, 4)
    assert dense.path == "lowp"
    monkeypatch.setattr(Int8Linear, "_chosen", {(96, 40, 4, bias, False): "lowp"})
    q = Int8Linear(lin, torch.bfloat16, 4)
    assert q.path == "lowp"
    for m in (1, 4, 16, 40):  # 40 rows: past kernels.MAX_ROWS, the library's kernels
        x = torch.randn(m, 96).to(torch.bfloat16)
        torch.testing.assert_close(dense(x).float(), torch.nn.functional.linear(x.float(), dense.weight.float(),
                                   None if dense.bias is None else dense.bias.float()), atol=2e-2, rtol=2e-2)
        ref = x.float() @ q.dequantized.t() + (0 if q.bias is None else q.bias.float())
        torch.testing.assert_close(q(x).float(), ref, atol=2e-2, rtol=2e-2)


def test_attnlab_kernels_0_falls_back_to_torch_kernels():
    """ATTNLAB_KERNELS=0 (the benchmarks' other side): nothing is built or loaded, bf16/int8 still run."""
    code = ("import torch; from attnlab import kernels; from attnlab.engine.quantize import Int8Linear, DenseLinear;"
            "assert kernels.lowp() is None; lin = torch.nn.Linear(32, 16);"
            "q = Int8Linear(lin, torch.bfloat16); d = DenseLinear(lin, torch.bfloat16);"
            "assert q.path == 'int8pack' and d.path != 'lowp', (q.path, d.path);"
            "x = torch.randn(2, 32).bfloat16(); q(x); d(x); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "ATTNLAB_KERNELS": "0"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

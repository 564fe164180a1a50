"""The AVX2 few-row GEMM kernel against torch's matmul: every tile shape, tails, bias, dispatch."""
import pytest
import torch
import torch.nn.functional as F

from tritonllm.engine import cpu_kernels
from tritonllm.engine.fp8 import linear as onednn_linear

ext = cpu_kernels.load()
needs_kernel = pytest.mark.skipif(ext is None, reason="AVX2 kernel not available on this machine")


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 9, 12, 15, 16, 33, 96])
@pytest.mark.parametrize("n,k", [(48, 64), (37, 770), (19, 7), (1, 8)])
def test_kernel_matches_torch_for_every_tile_and_tail(m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = (torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g))
    ref = x.double() @ w.double().T
    tol = 1e-5 * (k ** 0.5) * 4
    torch.testing.assert_close(ext.linear(x, w), ref.float(), rtol=0, atol=tol)
    torch.testing.assert_close(ext.linear(x, w, b), (ref + b.double()).float(), rtol=0, atol=tol)


@needs_kernel
def test_kernel_refuses_what_it_cannot_compute():
    with pytest.raises(RuntimeError, match="float32"):
        ext.linear(torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="x \\[M, K\\]"):
        ext.linear(torch.randn(2, 8), torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="contiguous"):
        ext.linear(torch.randn(2, 8), torch.randn(8, 4).T)
    with pytest.raises(RuntimeError, match="bias"):
        ext.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(5))


@needs_kernel
def test_dispatch_uses_kernel_for_few_rows_and_onednn_beyond():
    lin = cpu_kernels.make_linear(ext)
    assert lin is not onednn_linear
    w = torch.randn(64, 32)
    for m in (1, cpu_kernels.MAX_ROWS, cpu_kernels.MAX_ROWS + 1, 300):
        x = torch.randn(m, 32)
        torch.testing.assert_close(lin(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    xt = torch.randn(32, 4).T                       # non-contiguous activations are copied, not refused
    torch.testing.assert_close(lin(xt, w), F.linear(xt, w), rtol=1e-5, atol=1e-4)


def test_modes():
    cpu = torch.device("cpu")
    assert cpu_kernels.select("torch", cpu, torch.float32) is None
    assert cpu_kernels.select("auto", cpu, torch.bfloat16) is None   # fp32 kernel only
    with pytest.raises(ValueError, match="cpu_kernels must be one of"):
        cpu_kernels.select("fast", cpu, torch.float32)
    with pytest.raises(ValueError, match="needs float32"):
        cpu_kernels.select("native", cpu, torch.bfloat16)

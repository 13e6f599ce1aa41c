"""linear_small_m (decode GEMV) against torch.nn.functional.linear in fp32."""
import pytest
import torch
import torch.nn.functional as F

import llmkern

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,k,n", [(1, 576, 1728), (3, 576, 577), (16, 1536, 576), (2, 1000, 33), (5, 520, 9)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_fp32_linear(dtype, rows, k, n, bias):
    x = torch.randn(rows, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    same = F.linear(x, w, b).float()  # torch in the same dtype: the error budget
    out = llmkern.linear_small_m(x, w, b)
    assert out.dtype == dtype and out.shape == (rows, n)
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * (same - ref).abs().max().item() + TOL[dtype] * ref.abs().max().item()


def test_strided_rows_and_weight_view():
    big = torch.randn(4, 700)
    x = big[:, 50:626]  # row stride 700, as a slice of a fused activation
    w_full = torch.randn(300, 640)
    w = w_full[:, :576]  # weight rows contiguous, row stride 640
    torch.testing.assert_close(llmkern.linear_small_m(x, w), F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=2e-4)  # K=576 sums of O(1) terms


def test_empty():
    assert llmkern.linear_small_m(torch.zeros(0, 8), torch.zeros(3, 8)).shape == (0, 3)


def test_opcheck_and_compile():
    x, w, b = torch.randn(2, 64), torch.randn(40, 64), torch.randn(40)
    torch.library.opcheck(llmkern.linear_small_m.op, (x, w, b))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x):
        return llmkern.linear_small_m(x * 2, w, b)

    torch.testing.assert_close(f(x), F.linear(x * 2, w, b), rtol=1e-5, atol=1e-5)

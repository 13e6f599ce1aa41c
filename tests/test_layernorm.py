"""rms_norm / fused_add_rms_norm / silu_and_mul on every backend (cpu, simt = the CUDA kernels
emulated, cuda) against plain torch in fp32 with HF's rounding order."""
import pytest
import torch
import torch.nn.functional as F

import llmkern

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-5


def ref_rms_norm(x, w, eps=EPS):
    """HF LlamaRMSNorm: fp32 statistics, x * inv rounded to the dtype, then times the weight."""
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w.float() * h.float()


def ulp_tol(dtype, ref):
    # one rounding of the result plus one of x * inv (scaled by the weight) in the storage dtype
    eps = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    return 2 * eps * ref.abs().max().item() + 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 64), (3, 1000)])
def test_rms_norm(backend, dtype, rows, hidden):
    dev = backend.device
    x = (torch.randn(rows, hidden) * 3).to(dtype).to(dev)
    w = (torch.rand(hidden) + 0.5).to(dtype).to(dev)
    out = torch.empty_like(x)
    llmkern.rms_norm(out, x, w, EPS)
    ref = ref_rms_norm(x.cpu(), w.cpu())
    assert (out.cpu().float() - ref).abs().max().item() <= ulp_tol(dtype, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_in_place(backend, dtype):
    dev = backend.device
    x = torch.randn(5, 320).to(dtype).to(dev)
    r = torch.randn(5, 320).to(dtype).to(dev)
    w = (torch.rand(320) + 0.5).to(dtype).to(dev)
    x0, r0 = x.cpu().clone(), r.cpu().clone()
    llmkern.fused_add_rms_norm(x, r, w, EPS)
    h = x0 + r0  # the residual in the storage dtype, as HF's residual stream keeps it
    assert torch.equal(r.cpu(), h)
    ref = ref_rms_norm(h, w.cpu())
    assert (x.cpu().float() - ref).abs().max().item() <= ulp_tol(dtype, ref)


@pytest.mark.parametrize("cvt", ["1", "0"])
def test_bf16_norm_rounding_is_torchs_with_denormals(cvt):
    """The CPU's bf16 residual sums and norm outputs round as torch rounds, with the hardware
    rounding (LLMKERN_BF16_CVT=1, where the CPU has it) and without: rows of 16-wide vectors and a
    tail, denormal sums among them (the instruction would flush those)."""
    from runtime_helpers import run_python

    run_python(
        "import torch, llmkern\n"
        "g = torch.Generator().manual_seed(5)\n"
        "x = (torch.randn(6, 72, generator=g) * 3).bfloat16(); r = (torch.randn(6, 72, generator=g) * 3).bfloat16()\n"
        "tiny = torch.tensor([2.0 ** -127, -(2.0 ** -131), 3 * 2.0 ** -133, 2.0 ** -126]).bfloat16()\n"
        "x[1, :4] = tiny; r[1, :4] = -tiny / 2   # sums that are denormal in bf16 too\n"
        "x[4, 70:] = tiny[:2]; r[4, 70:] = tiny[2:]\n"
        "w = (torch.rand(72, generator=g) + 0.5).bfloat16()\n"
        "h = x + r\n"
        "assert (h.float().abs() < 2.0 ** -126).logical_and(h != 0).any()\n"
        "llmkern.fused_add_rms_norm(x, r, w, 1e-5)\n"
        "assert torch.equal(r, h), (r - h).abs().max()\n"
        "hf = h.float(); inv = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)\n"
        "ref = (w.float() * (hf * inv).bfloat16().float()).bfloat16()\n"
        "assert ((x.float() - ref.float()).abs() <= ref.float().abs() * 2 ** -7 + 1e-30).all()\n"
        "out = torch.empty_like(h); llmkern.rms_norm(out, h, w, 1e-5)\n"
        "assert torch.equal(out, x)\n",
        LLMKERN_BF16_CVT=cvt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(backend, dtype):
    dev = backend.device
    g = (torch.randn(6, 2 * 300) * 4).to(dtype).to(dev)
    out = torch.empty(6, 300, dtype=dtype, device=dev)
    llmkern.silu_and_mul(out, g)
    gf = g.cpu().float()
    ref = F.silu(gf[:, :300]) * gf[:, 300:]
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    assert (out.cpu().float() - ref).abs().max().item() <= tol * ref.abs().max().item() + 1e-6
    # large |gate|: no overflow in exp, silu(g) -> g for g >> 0 and -> 0 for g << 0
    big = torch.tensor([[-200.0, -30.0, 30.0, 200.0, 1.0, 1.0, 1.0, 1.0]], device=dev).to(dtype)
    o = torch.empty(1, 4, dtype=dtype, device=dev)
    llmkern.silu_and_mul(o, big)
    torch.testing.assert_close(o.cpu().float(), F.silu(big.cpu().float()[:, :4]), rtol=1e-2, atol=1e-6)


def test_strided_rows_nd_shapes_and_aliasing(backend):
    dev = backend.device
    base = torch.randn(4, 3, 200, device=dev)
    x = base[..., :128]  # rows of a wider buffer: row stride 200, leading dims flattened to 12 rows
    w = torch.rand(128, device=dev) + 0.5
    out = torch.empty(4, 3, 128, device=dev)
    llmkern.rms_norm(out, x, w, EPS)
    ref = ref_rms_norm(x.cpu().reshape(12, 128), w.cpu()).reshape(4, 3, 128)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(base[..., 128:], base[..., 128:].clone())  # untouched around the view
    y = x.clone()
    llmkern.rms_norm(y, y, w, EPS)  # in place
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-5, atol=1e-5)
    gu = torch.randn(2, 5, 64, device=dev)
    act = torch.empty(2, 5, 32, device=dev)
    llmkern.silu_and_mul(act, gu)
    torch.testing.assert_close(act.cpu(), F.silu(gu.cpu()[..., :32]) * gu.cpu()[..., 32:], rtol=1e-5, atol=1e-6)


def test_empty_rows_and_opcheck():
    x = torch.zeros(0, 16)
    llmkern.rms_norm(torch.zeros(0, 16), x, torch.ones(16), EPS)
    a, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.rand(64)
    torch.library.opcheck(llmkern.rms_norm.op, (torch.empty(3, 64), a, w, EPS))
    torch.library.opcheck(llmkern.fused_add_rms_norm.op, (a.clone(), r.clone(), w, EPS))
    torch.library.opcheck(llmkern.silu_and_mul.op, (torch.empty(3, 32), a))

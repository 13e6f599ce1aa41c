"""llmkern.compat.flash_attn's ``layers.rotary`` and ``ops`` (rms_norm, triton.layer_norm's
rms_norm_fn / RMSNorm): flash-attn 2.8's parameters, against plain-torch references of its
documented behaviour, on every backend."""
from __future__ import annotations

import pytest
import torch

from llmkern.compat.flash_attn.layers.rotary import (apply_rotary_emb, apply_rotary_emb_func,
                                                     apply_rotary_emb_kv_, apply_rotary_emb_qkv_)
from llmkern.compat.flash_attn.ops.rms_norm import RMSNorm as OldRMSNorm, rms_norm
from llmkern.compat.flash_attn.ops.triton.layer_norm import RMSNorm, rms_norm_fn


def ref_rotary(x, cos, sin, pos, interleaved):
    """x [n, H, D] rows at positions [n], fp64: the first 2 * cos.shape[-1] features rotated."""
    rd = 2 * cos.shape[-1]
    c, s = cos.double()[pos][:, None], sin.double()[pos][:, None]
    xd = x.double().clone()
    r = xd[..., :rd]
    a, b = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :rd // 2], r[..., rd // 2:])
    o1, o2 = a * c - b * s, b * c + a * s
    xd[..., :rd] = torch.stack([o1, o2], -1).flatten(-2) if interleaved else torch.cat([o1, o2], -1)
    return xd


def _cos_sin(n, rd):
    ang = torch.rand(n, rd // 2) * 6
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_apply_rotary_emb_batch(backend, interleaved, offsets, dtype):
    b, s, h, d, rd = 3, 5, 2, 32, 16
    x = torch.randn(b, s, h, d).to(dtype)
    cos, sin = _cos_sin(20, rd)
    off = 4 if offsets == "int" else torch.tensor([0, 7, 2], dtype=torch.int32)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=off)
    offs = torch.full((b,), 4) if offsets == "int" else off.long()
    pos = (torch.arange(s)[None] + offs[:, None]).reshape(-1)
    ref = ref_rotary(x.reshape(-1, h, d), cos, sin, pos, interleaved).reshape(b, s, h, d)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    assert not torch.equal(out, x)  # not in place by default
    y = x.clone()
    assert apply_rotary_emb_func(y, cos, sin, interleaved, True, off) is y and torch.equal(y, out)


def test_apply_rotary_emb_varlen(backend):
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    x = torch.randn(10, 2, 16)
    cos, sin = _cos_sin(16, 16)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.tensor([1, 0, 5]), cu_seqlens=cu, max_seqlen=7)
    pos = torch.tensor([1, 2, 3] + [5 + i for i in range(7)])
    torch.testing.assert_close(out.double(), ref_rotary(x, cos, sin, pos, False), atol=1e-5, rtol=1e-5)


def test_apply_rotary_emb_qkv_and_kv_in_place(backend):
    b, s, h, d = 2, 4, 2, 16
    cos, sin = _cos_sin(8, 8)
    qkv = torch.randn(b, s, 3, h, d)
    orig = qkv.clone()
    assert apply_rotary_emb_qkv_(qkv, cos, sin) is qkv
    for i in (0, 1):
        assert torch.allclose(qkv[:, :, i], apply_rotary_emb(orig[:, :, i], cos, sin), atol=1e-6)
    assert torch.equal(qkv[:, :, 2], orig[:, :, 2])
    gqa = torch.randn(b, s, 4 + 2 * 1, d)  # Hq = 4, Hk = 1
    g0 = gqa.clone()
    apply_rotary_emb_qkv_(gqa, cos, sin, num_heads_q=4)
    assert torch.allclose(gqa[:, :, :5], apply_rotary_emb(g0[:, :, :5], cos, sin), atol=1e-6)
    assert torch.equal(gqa[:, :, 5:], g0[:, :, 5:])
    kv = torch.randn(b, s, 2, h, d)
    k0 = kv.clone()
    apply_rotary_emb_kv_(kv, cos, sin)
    assert torch.allclose(kv[:, :, 0], apply_rotary_emb(k0[:, :, 0], cos, sin), atol=1e-6)
    assert torch.equal(kv[:, :, 1], k0[:, :, 1])


def _ref_rms(x, w, eps, bias=None):
    xf = x.double()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    return y if bias is None else y + bias.double()


def test_rms_norm_and_modules(backend):
    x, w = torch.randn(3, 4, 64), torch.randn(64)
    torch.testing.assert_close(rms_norm(x, w, 1e-5).double(), _ref_rms(x, w, 1e-5), atol=1e-5, rtol=1e-5)
    m = OldRMSNorm(64, eps=1e-5)
    torch.testing.assert_close(m(x).double(), _ref_rms(x, torch.ones(64), 1e-5), atol=1e-5, rtol=1e-5)
    assert isinstance(RMSNorm(8), torch.nn.Module)


@pytest.mark.parametrize("residual_in_fp32", [False, True])
def test_rms_norm_fn_residual_prenorm_bias(backend, residual_in_fp32):
    x, r = torch.randn(5, 32).half(), torch.randn(5, 32).half()
    w, bias = torch.randn(32).half(), torch.randn(32).half()
    y, res = rms_norm_fn(x, w, bias, residual=r, eps=1e-6, prenorm=True, residual_in_fp32=residual_in_fp32)
    s = x.float() + r.float()
    assert res.dtype == (torch.float32 if residual_in_fp32 else torch.float16)
    torch.testing.assert_close(res.float(), s.to(res.dtype).float())
    torch.testing.assert_close(y.double(), _ref_rms(s.half(), w, 1e-6, bias), atol=2e-2, rtol=1e-2)
    with pytest.raises(NotImplementedError):
        rms_norm_fn(x, w, None, dropout_p=0.1)

"""The sm_90a prefill kernel (csrc/attention/flash_prefill_sm90.cuh: TMA producer, two wgmma
consumer warpgroups) against the plain-torch references, with the switch that selects it
(use_sm90_prefill): on the SIMT emulator, and on an sm_90 GPU (marker `cuda`).
Each case also checks that the call really ran on that kernel."""
from __future__ import annotations

import pytest
import torch

import llmkern
from reference import ref_attention
from test_attention_cuda import assert_fa_close, run_varlen

BF16, FP16 = torch.bfloat16, torch.float16


def _module(name):
    return llmkern._simt if name == "simt" else llmkern._C


@pytest.fixture(params=["simt", pytest.param("cuda", marks=pytest.mark.cuda)])
def sm90(request):
    """(backend, module) with the sm_90 prefill kernel selected."""
    from conftest import _enter

    if request.param == "cuda":
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("needs an sm_90 GPU")
        if "90a" not in llmkern.build_info().get("cuda_archs", ""):
            pytest.skip("llmkern was not compiled for 90a")
    ctx, b = _enter(request.param)
    mod = _module(request.param)
    prev = mod.use_sm90_prefill(True)
    try:
        if ctx is None:
            yield b, mod
        else:
            with ctx:
                yield b, mod
    finally:
        mod.use_sm90_prefill(prev)


CASES = [
    # id, dtype, D, lens_q, lens_k, hq, hkv, kwargs
    ("bf16-hd128-causal-prefix-gqa", BF16, 128, [150, 40], [170, 300], 4, 2, dict(causal=True)),
    ("fp16-hd128-noncausal", FP16, 128, [130], [200], 2, 2, {}),
    ("bf16-hd64-causal-empty", BF16, 64, [140, 0, 20], [140, 5, 0], 2, 2, dict(causal=True)),
    ("fp16-hd64-window", FP16, 64, [129], [129], 1, 1, dict(window=(10, 3))),
    ("bf16-hd128-sq-gt-sk", BF16, 128, [200], [60], 2, 1, dict(causal=True, scale=0.2)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sm90_prefill_varlen(sm90, case):
    b, mod = sm90
    _, dtype, D, lens_q, lens_k, hq, hkv, kw = case
    torch.manual_seed(len(lens_q) * 7 + D)
    before = mod.sm90_prefill_launches()
    run_varlen(b.device, dtype, D, lens_q, lens_k, hq, hkv, **dict(kw))
    assert mod.sm90_prefill_launches() == before + 1, "the call did not run on the sm_90 kernel"


def test_sm90_prefill_dense_and_unused_rows(sm90):
    """flash_attn_func (dense batch); then varlen with NaN in K/V rows no sequence owns: the tail
    tile reads them but they must not reach the output."""
    b, mod = sm90
    dev = b.device
    torch.manual_seed(3)
    q = torch.randn(2, 130, 2, 128).to(BF16)
    k = torch.randn(2, 130, 2, 128).to(BF16)
    v = torch.randn(2, 130, 2, 128).to(BF16)
    before = mod.sm90_prefill_launches()
    out = llmkern.flash_attn_func(q.to(dev), k.to(dev), v.to(dev), causal=True)
    assert mod.sm90_prefill_launches() == before + 1
    for i in range(2):
        ref, _ = ref_attention(q[i], k[i], v[i], 128 ** -0.5, causal=True)
        same, _ = ref_attention(q[i], k[i], v[i], 128 ** -0.5, causal=True, compute_dtype=BF16)
        assert_fa_close(out[i], ref, same, f"dense batch {i}")

    lens = [135]
    q = torch.randn(135, 1, 64).to(FP16)
    k = torch.randn(256, 1, 64).to(FP16)
    v = torch.randn(256, 1, 64).to(FP16)
    k[135:] = float("nan")
    v[135:] = float("nan")
    cu = torch.tensor([0, 135], dtype=torch.int32)
    o = llmkern.flash_attn_varlen_func(q.to(dev), k.to(dev), v.to(dev), cu.to(dev), cu.to(dev), 135, 135,
                                       causal=False)
    assert mod.sm90_prefill_launches() == before + 2
    ref, _ = ref_attention(q, k[:135], v[:135], 64 ** -0.5)
    same, _ = ref_attention(q, k[:135], v[:135], 64 ** -0.5, compute_dtype=FP16)
    assert torch.isfinite(o.float().cpu()).all()
    assert_fa_close(o, ref, same, "unused NaN rows")


def test_sm90_prefill_not_taken_where_it_does_not_apply(sm90):
    """Softcap (and paging, ALiBi, other head dims) stay on the cp.async kernel."""
    b, mod = sm90
    torch.manual_seed(5)
    before = mod.sm90_prefill_launches()
    run_varlen(b.device, BF16, 128, [130], [130], 2, 2, causal=True, softcap=4.0)
    run_varlen(b.device, BF16, 96, [130], [130], 2, 2, causal=True)
    assert mod.sm90_prefill_launches() == before

"""The sm_90a prefill kernel (csrc/attention/flash_prefill_sm90.cuh: TMA producer, two wgmma
consumer warpgroups) against the plain-torch references, with the switch that selects it
(use_sm90_prefill): on the SIMT emulator, and on an sm_90 GPU (marker `cuda`).
Each case also checks that the call really ran on that kernel (or, for what it does not take,
that it did not). Dense and paged K/V (page sizes below, equal to and above the 128-key tile),
GQA with and without query heads packed into the row tile, softcap, ALiBi, windows."""
from __future__ import annotations

import pytest
import torch

import llmkern
from reference import ref_attention
from test_attention_cuda import _cu, _paged, assert_fa_close, assert_lse_close, run_kvcache, run_varlen

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
    # id, dtype, D, lens_q, lens_k, hq, hkv, page, kwargs
    ("bf16-hd128-causal-prefix-gqa", BF16, 128, [150, 40], [170, 300], 4, 2, None, dict(causal=True)),
    ("fp16-hd128-noncausal", FP16, 128, [130], [200], 2, 2, None, {}),
    ("bf16-hd64-causal-empty", BF16, 64, [140, 0, 20], [140, 5, 0], 2, 2, None, dict(causal=True)),
    ("fp16-hd64-window", FP16, 64, [129], [129], 1, 1, None, dict(window=(10, 3))),
    ("bf16-hd128-sq-gt-sk", BF16, 128, [200], [60], 2, 1, None, dict(causal=True, scale=0.2)),
    # paged K/V: 16 (8 page slices per tile), 64, 256 (a tile inside a page); chunked-prefill
    # shapes (queries the tail of longer keys)
    ("bf16-hd128-paged16-causal-prefix", BF16, 128, [130, 20], [290, 20], 2, 2, 16, dict(causal=True)),
    ("fp16-hd64-paged16-noncausal", FP16, 64, [129], [150], 1, 1, 16, {}),
    ("bf16-hd64-paged64-causal-prefix", BF16, 64, [140], [200], 2, 1, 64, dict(causal=True)),
    ("fp16-hd128-paged256-window", FP16, 128, [130], [300], 1, 1, 256, dict(window=(40, 0))),
    ("bf16-hd128-paged8-noncausal", BF16, 128, [129], [140], 1, 1, 8, {}),
    ("fp16-hd64-paged32-causal-prefix", FP16, 64, [129], [250], 2, 2, 32, dict(causal=True)),
    # GQA: 9/3 (3 heads do not divide the 128-row tile: 126 rows per CTA when packed), 32/8
    ("bf16-hd64-gqa9-3-packed-causal", BF16, 64, [50, 7], [80, 7], 9, 3, None, dict(causal=True)),
    ("fp16-hd128-gqa9-3-paged16", FP16, 128, [130], [160], 9, 3, 16, dict(causal=True)),
    ("bf16-hd64-gqa32-8-packed-paged16", BF16, 64, [40], [100], 32, 8, 16, dict(causal=True)),
    # head dim 256: 64-key tiles (page 16 = 4 slices per tile; page 128 = a tile inside a page)
    ("bf16-hd256-causal-prefix", BF16, 256, [130], [200], 1, 1, None, dict(causal=True)),
    ("fp16-hd256-paged16-gqa-packed-softcap", FP16, 256, [40], [90], 4, 2, 16, dict(causal=True, softcap=5.0)),
    ("bf16-hd256-paged128-noncausal", BF16, 256, [129], [150], 1, 1, 128, {}),
    # softcap and ALiBi in the consumers' softmax (unfolded scores)
    ("bf16-hd128-softcap-causal", BF16, 128, [130], [130], 2, 2, None, dict(causal=True, softcap=4.0)),
    ("fp16-hd64-alibi-paged16", FP16, 64, [70, 40], [100, 40], 4, 2, 16, dict(causal=True, alibi=torch.rand(2, 4))),
    ("bf16-hd64-softcap-alibi-window", BF16, 64, [129], [129], 2, 1, None,
     dict(window=(30, 5), softcap=3.0, alibi=torch.rand(2))),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_sm90_prefill_varlen(sm90, case):
    b, mod = sm90
    _, dtype, D, lens_q, lens_k, hq, hkv, page, kw = case
    torch.manual_seed(len(lens_q) * 7 + D)
    before = mod.sm90_prefill_launches()
    run_varlen(b.device, dtype, D, lens_q, lens_k, hq, hkv, page=page, **dict(kw))
    assert mod.sm90_prefill_launches() == before + 1, "the call did not run on the sm_90 kernel"


def test_sm90_prefill_kvcache_paged_append(sm90):
    """flash_attn_with_kvcache on a paged cache with new rows appended (a prefill chunk after a
    cached prefix), GQA packed: the paged kvcache front reaches the kernel too."""
    b, mod = sm90
    torch.manual_seed(11)
    before = mod.sm90_prefill_launches()
    run_kvcache(b.device, BF16, 64, [60, 3], 40, 4, 2, page=16, append=True, causal=True)
    assert mod.sm90_prefill_launches() == before + 1


def test_sm90_prefill_paged_stale_slots(sm90):
    """Paged loads fetch whole pages: NaN in a sequence's last page past its length, in blocks no
    sequence owns, and block-table entries past the sequence's pages pointing anywhere (never
    loaded) must not reach the output."""
    b, mod = sm90
    dev = b.device
    torch.manual_seed(13)
    page, lens = 16, [135, 17]
    q = torch.randn(sum(lens), 2, 64).to(FP16)
    k = torch.randn(sum(lens), 1, 64).to(FP16)
    v = torch.randn(sum(lens), 1, 64).to(FP16)
    cu = _cu(lens, "cpu")
    ks = [k[cu[i]:cu[i + 1]] for i in range(2)]
    vs = [v[cu[i]:cu[i + 1]] for i in range(2)]
    state = torch.random.get_rng_state()
    kc, bt = _paged(ks, page, "cpu")
    torch.random.set_rng_state(state)
    vc, _ = _paged(vs, page, "cpu")
    used = set()
    for i, n in enumerate(lens):
        nb = (n + page - 1) // page
        used.update(bt[i, :nb].tolist())
        last = int(bt[i, nb - 1])
        kc[last, n % page or page:] = float("nan")
        vc[last, n % page or page:] = float("nan")
    for blk in range(kc.shape[0]):
        if blk not in used:
            kc[blk] = float("nan")
            vc[blk] = float("nan")
    bt = torch.cat([bt, torch.full((2, 4), kc.shape[0] - 1, dtype=torch.int32)], 1)  # slack entries
    before = mod.sm90_prefill_launches()
    o, lse = llmkern.flash_attn_varlen_func(q.to(dev), kc.to(dev), vc.to(dev), cu.to(dev), cu.to(dev), max(lens),
                                            max(lens), causal=True, block_table=bt.to(dev), return_softmax_lse=True)
    assert mod.sm90_prefill_launches() == before + 1
    assert torch.isfinite(o.float().cpu()).all()
    for i in range(2):
        sl = slice(int(cu[i]), int(cu[i + 1]))
        ref, lse_ref = ref_attention(q[sl], ks[i], vs[i], 64 ** -0.5, causal=True)
        same, _ = ref_attention(q[sl], ks[i], vs[i], 64 ** -0.5, causal=True, compute_dtype=FP16)
        assert_fa_close(o[sl], ref, same, f"sequence {i}")
        assert_lse_close(lse[:, sl], lse_ref, f"lse {i}")


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
    """Head dims other than 64, 128 and 256, page sizes that are not a multiple of 8 dividing the
    key tile (nor a multiple of it), and split-KV stay on the mma.sync kernel (and still give the
    right answer)."""
    b, mod = sm90
    torch.manual_seed(5)
    before = mod.sm90_prefill_launches()
    run_varlen(b.device, BF16, 96, [130], [130], 2, 2, causal=True)
    run_varlen(b.device, BF16, 64, [130], [130], 1, 1, page=24, causal=True)
    run_varlen(b.device, FP16, 64, [130], [130], 1, 1, page=4, causal=True)
    run_kvcache(b.device, BF16, 64, [60], 40, 2, 1, page=16, append=True, causal=True, num_splits=2)
    assert mod.sm90_prefill_launches() == before


def test_sm90_prefill_engine_layer(sm90):
    """The engine's attention layer (layers.attention.paged_attention) as a prompt is prefilled in
    two chunks: the first on the fresh K/V (dense), the second over the paged cache holding the
    first (chunked prefill / a cached prefix), q/k/v being views of one fused QKV projection.
    Both prefill calls run on the sm_90 kernel; outputs match attention over the whole prompt."""
    from llmkern.layers.attention import AttnMetadata, paged_attention

    b, mod = sm90
    dev = b.device
    torch.manual_seed(17)
    hq, hkv, D, page, nblk = 4, 2, 64, 16, 24
    first, second = 150, 100
    n = first + second
    qkv = torch.randn(n, (hq + 2 * hkv) * D).to(BF16)
    q = qkv[:, :hq * D].view(n, hq, D)
    k = qkv[:, hq * D:(hq + hkv) * D].view(n, hkv, D)
    v = qkv[:, (hq + hkv) * D:].view(n, hkv, D)
    kc = torch.zeros(nblk, page, hkv, D, dtype=BF16, device=dev)
    vc = torch.zeros_like(kc)
    blocks = torch.randperm(nblk)[:(n + page - 1) // page].to(torch.int32)
    slots = (blocks.long()[torch.arange(n) // page] * page + torch.arange(n) % page)
    scale = D ** -0.5
    ref, _ = ref_attention(q, k, v, scale, causal=True)
    same, _ = ref_attention(q, k, v, scale, causal=True, compute_dtype=BF16)
    before = mod.sm90_prefill_launches()

    def cu(x):
        return torch.tensor([0, x], dtype=torch.int32, device=dev)

    rows = slice(0, first)
    out = torch.empty(first, hq, D, dtype=BF16, device=dev)
    meta = AttnMetadata(slot_mapping=slots[rows].to(dev), num_prefill_tokens=first, prefill_cu_q=cu(first),
                        prefill_max_q=first)
    paged_attention(q[rows].to(dev), k[rows].to(dev), v[rows].to(dev), kc, vc, meta, scale, (-1, -1), out)
    assert_fa_close(out, ref[rows], same[rows], "first chunk (dense)")

    rows = slice(first, n)
    out = torch.empty(second, hq, D, dtype=BF16, device=dev)
    meta = AttnMetadata(slot_mapping=slots[rows].to(dev), num_prefill_tokens=second, prefill_cu_q=cu(second),
                        prefill_cu_k=cu(n), prefill_max_q=second, prefill_max_k=n,
                        prefill_block_table=blocks.view(1, -1).to(dev))
    paged_attention(q[rows].to(dev), k[rows].to(dev), v[rows].to(dev), kc, vc, meta, scale, (-1, -1), out)
    assert_fa_close(out, ref[rows], same[rows], "second chunk (paged, GQA packed)")
    assert mod.sm90_prefill_launches() == before + 2

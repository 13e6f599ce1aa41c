"""Attention ops against the plain-torch references (tests/reference.py), with flash-attn's
tolerance rule: max|out - ref| <= 2 * max|torch_same_dtype - ref| + floor, where ref is the fp32
computation on the same (rounded) inputs and torch_same_dtype the same computation carried out in
the input dtype. The grid of the issue is sampled (not its full product) to stay quick."""
import pytest
import torch

import llmkern
from llmkern.ops import attention as attn_ops
from reference import ref_kvcache, ref_varlen

# The CUDA attention kernels (csrc/attention/*.cu) exist: the same tests also run on the SIMT
# emulator and on GPUs. (False skips them with a reason, e.g. while a kernel is rewritten.)
CUDA_KERNELS_READY = True

FLOOR = {torch.float32: 3e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture
def be(backend):
    if backend.name != "cpu" and not CUDA_KERNELS_READY:
        pytest.skip("attention has no CUDA kernel yet (csrc/attention/*.cu): CPU only for now")
    return backend


def _cu(lens, dev):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=dev)


def _assert_close(out, ref, same_dtype, dtype, what="out"):
    err = (out.float() - ref).abs().max().item() if out.numel() else 0.0
    base = (same_dtype.float() - ref).abs().max().item() if out.numel() else 0.0
    tol = 2 * base + FLOOR[dtype]
    assert err <= tol, f"{what}: max error {err:.3g} > {tol:.3g} (torch {dtype} error {base:.3g})"


def _assert_lse(lse, ref):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isinf(lse), ~fin), "rows without keys must have lse = +inf"
    if fin.any():
        assert (lse[fin] - ref[fin]).abs().max().item() < 1e-3


def _paged(seqs, block_size, dev, extra_blocks=3, garbage=False):
    """A random (permuted, non-contiguous) block table for sequences of the given lengths. Unused
    entries are -1, or with `garbage` random ids anywhere in int32 (out of range, negative): the
    kernels must never read them."""
    need = [max(1, (n + block_size - 1) // block_size) for n in seqs]
    num_blocks = sum(need) + extra_blocks
    perm = torch.randperm(num_blocks)
    width = max(need) + 1
    table = torch.full((len(seqs), width), -1, dtype=torch.int32)
    if garbage:
        table = torch.randint(-2**31, 2**31 - 1, (len(seqs), width), dtype=torch.int32)
        table[:, -1] = torch.tensor([num_blocks, 2**31 - 1, -2])[torch.arange(len(seqs)) % 3].to(torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return table.to(dev), num_blocks


# (hq, hkv, d, causal, window, softcap, alibi)
VARLEN_CASES = [
    (2, 2, 64, False, (-1, -1), 0.0, None),
    (6, 2, 64, True, (-1, -1), 0.0, None),
    (8, 1, 128, True, (-1, -1), 0.0, None),
    (3, 3, 80, True, (-1, -1), 2.0, None),
    (6, 2, 96, False, (16, 4), 0.0, None),
    (8, 1, 256, True, (8, -1), 0.0, None),
    (4, 4, 72, False, (-1, -1), 0.0, "heads"),
    (6, 2, 128, True, (-1, -1), 5.0, "batch"),
    (2, 1, 8, False, (3, 3), 0.0, None),
    # a wide window: masked tiles, unmasked ones, then the window's left edge masked again
    (2, 1, 64, True, (200, -1), 0.0, None),
]


def _kw(causal, window, softcap, alibi):
    return dict(causal=causal, window=window, softcap=softcap, alibi=alibi)


def _alibi(kind, batch, hq, dev):
    if kind is None:
        return None
    if kind == "heads":
        return torch.rand(hq, device=dev) * 0.5
    return torch.rand(batch, hq, device=dev) * 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", VARLEN_CASES, ids=[f"h{c[0]}-{c[1]}d{c[2]}{'c' if c[3] else ''}w{c[4]}s{c[5]}a{c[6]}" for c in VARLEN_CASES])
def test_varlen_dense(be, dtype, case):
    hq, hkv, d, causal, window, softcap, alibi_kind = case
    dev = be.device
    # ragged: empty sequences, single tokens, tile boundaries +-1, fewer keys than queries, longer
    lens_q = [0, 1, 3, 63, 65, 130, 40, 7]
    lens_k = [5, 1, 0, 64, 65, 130, 20, 300]
    q = torch.randn(sum(lens_q), hq, d, device=dev).to(dtype)
    k = torch.randn(sum(lens_k), hkv, d, device=dev).to(dtype)
    v = torch.randn(sum(lens_k), hkv, d, device=dev).to(dtype)
    cu_q, cu_k = _cu(lens_q, dev), _cu(lens_k, dev)
    alibi = _alibi(alibi_kind, len(lens_q), hq, dev)
    scale = 0.3 if softcap else d ** -0.5
    out, lse = llmkern.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), softmax_scale=scale if softcap else None,
        causal=causal, window_size=window, softcap=softcap, alibi_slopes=alibi, return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (hq, q.shape[0])
    kw = _kw(causal, window, softcap, alibi)
    ref, ref_lse = ref_varlen(q, k, v, cu_q, cu_k, scale, **kw)
    same, _ = ref_varlen(q, k, v, cu_q, cu_k, scale, compute_dtype=dtype, **kw)
    _assert_close(out, ref, same, dtype)
    _assert_lse(lse, ref_lse)


@pytest.mark.parametrize("block_size", [1, 5, 16, 256])
@pytest.mark.parametrize("dtype,hq,hkv,d", [(torch.bfloat16, 6, 2, 64), (torch.float32, 8, 1, 128), (torch.float16, 3, 3, 80)])
def test_varlen_paged(be, block_size, dtype, hq, hkv, d):
    """Chunked prefill / prefix hits: the queries are the last rows of each cached sequence.
    Key counts sit on block boundaries (exact multiples, +-1); unused block-table entries hold
    garbage ids for half the block sizes."""
    dev = be.device
    bs = block_size
    lens_k = [bs - 1 if bs > 1 else 3, bs, bs + 1, 2 * bs + 37, 0, 9, 3 * bs, 2 * bs - 1]
    lens_q = [min(n, c) for n, c in zip(lens_k, [4, 1, 40, 70, 0, 9, 33, 2 * bs - 1])]
    table, nblk = _paged(lens_k, bs, dev, garbage=bs in (5, 256))
    kc = torch.randn(nblk, bs, hkv, d, device=dev).to(dtype)
    vc = torch.randn(nblk, bs, hkv, d, device=dev).to(dtype)
    q = torch.randn(sum(lens_q), hq, d, device=dev).to(dtype)
    cu_q, cu_k = _cu(lens_q, dev), _cu(lens_k, dev)
    for causal, window in [(True, (-1, -1)), (False, (20, 0))]:
        out, lse = llmkern.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k),
                                                  causal=causal, window_size=window,
                                                  block_table=table, return_softmax_lse=True)
        kw = _kw(causal, window, 0.0, None)
        ref, ref_lse = ref_varlen(q, kc, vc, cu_q, cu_k, d ** -0.5, block_table=table, **kw)
        same, _ = ref_varlen(q, kc, vc, cu_q, cu_k, d ** -0.5, block_table=table, compute_dtype=dtype, **kw)
        _assert_close(out, ref, same, dtype)
        _assert_lse(lse, ref_lse)


def test_varlen_out_and_int64_indices(be):
    dev = be.device
    lens = [17, 0, 33]
    q = torch.randn(sum(lens), 4, 64, device=dev)
    k, v = torch.randn(sum(lens), 2, 64, device=dev), torch.randn(sum(lens), 2, 64, device=dev)
    cu = _cu(lens, dev)
    out = torch.full_like(q, float("nan"))
    res = llmkern.flash_attn_varlen_func(q, k, v, cu.long(), cu.long(), 33, 33, softmax_scale=0.05,
                                         causal=True, out=out)
    assert res is out
    ref, _ = ref_varlen(q, k, v, cu, cu, 0.05, causal=True)
    assert (out - ref).abs().max() < 3e-5
    # strided q (a slice of a fused qkv buffer) and an out view
    qkv = torch.randn(sum(lens), 3, 4, 64, device=dev)
    big = torch.zeros(sum(lens), 8, 64, device=dev)
    llmkern.flash_attn_varlen_func(qkv[:, 0], k, v, cu, cu, 33, 33, out=big[:, ::2])
    ref, _ = ref_varlen(qkv[:, 0], k, v, cu, cu, 64 ** -0.5)
    assert (big[:, ::2] - ref).abs().max() < 3e-5 and not big[:, 1::2].any()


def test_varlen_empty(be):
    dev = be.device
    q = torch.randn(0, 2, 64, device=dev)
    k = torch.randn(0, 2, 64, device=dev)
    cu = torch.zeros(3, dtype=torch.int32, device=dev)
    out, lse = llmkern.flash_attn_varlen_func(q, k, k, cu, cu, 0, 0, return_softmax_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


def _kvcache_case(dev, dtype, batch, s, hq, hkv, d, block_size, cache_lens, append, garbage=False):
    cap = max(cache_lens) + s + 5
    if block_size:
        table, nblk = _paged([n + s for n in cache_lens], block_size, dev, garbage=garbage)
        shape = (nblk, block_size, hkv, d)
    else:
        table, shape = None, (batch, cap, hkv, d)
    kc = torch.randn(shape, device=dev).to(dtype)
    vc = torch.randn(shape, device=dev).to(dtype)
    q = torch.randn(batch, s, hq, d, device=dev).to(dtype)
    kn = torch.randn(batch, s, hkv, d, device=dev).to(dtype) if append else None
    vn = torch.randn(batch, s, hkv, d, device=dev).to(dtype) if append else None
    lens = torch.tensor(cache_lens, dtype=torch.int32, device=dev)
    return q, kc, vc, kn, vn, lens, table


# (dtype, batch, s, hq, hkv, d, block_size, causal, window, softcap, alibi, append, num_splits)
KV_CASES = [
    (torch.bfloat16, 3, 1, 8, 2, 128, 16, False, (-1, -1), 0.0, None, True, 0),
    (torch.float32, 2, 1, 6, 2, 64, 5, False, (-1, -1), 0.0, None, False, 3),
    (torch.float16, 4, 1, 8, 1, 80, 1, False, (-1, -1), 0.0, "heads", True, 1),
    (torch.float32, 2, 1, 3, 3, 96, 0, False, (32, -1), 0.0, None, True, 0),
    (torch.bfloat16, 2, 4, 8, 2, 64, 16, True, (-1, -1), 0.0, None, True, 0),
    (torch.float32, 3, 5, 8, 1, 128, 256, True, (-1, -1), 3.0, None, True, 2),
    (torch.float16, 2, 3, 4, 4, 256, 0, True, (-1, -1), 0.0, "batch", True, 0),
    (torch.bfloat16, 2, 6, 16, 2, 64, 7, True, (10, 0), 0.0, None, True, 4),
    (torch.float32, 1, 1, 4, 1, 64, 16, False, (-1, -1), 0.0, None, True, 8),
]


@pytest.mark.parametrize("case", KV_CASES, ids=[f"{str(c[0])[6:]}-b{c[1]}s{c[2]}h{c[3]}-{c[4]}d{c[5]}bs{c[6]}{'c' if c[7] else ''}w{c[8]}sc{c[9]}a{c[10]}{'+kv' if c[11] else ''}n{c[12]}" for c in KV_CASES])
def test_kvcache(be, case):
    dtype, batch, s, hq, hkv, d, bs, causal, window, softcap, alibi_kind, append, splits = case
    dev = be.device
    cache_lens = [0, 300, 17, 1000][:batch] if batch > 1 else [1500]
    if bs:
        # On block boundaries: cached keys an exact multiple of the block size, cached + appended
        # keys an exact multiple, and one past / one short of a boundary.
        m = max(1, 300 // bs)
        cache_lens = [m * bs, m * bs - s, 2 * bs + 1, 3 * bs - 1][:batch] if batch > 1 else [1500 // bs * bs]
    q, kc, vc, kn, vn, lens, table = _kvcache_case(dev, dtype, batch, s, hq, hkv, d, bs, cache_lens, append,
                                                   garbage=bs in (5, 7, 256))
    alibi = _alibi(alibi_kind, batch, hq, dev)
    kw = _kw(causal, window, softcap, alibi)
    scale = d ** -0.5
    ref, ref_lse, ref_kc, ref_vc = ref_kvcache(q, kc, vc, lens, scale, k=kn, v=vn, block_table=table, **kw)
    same, _, _, _ = ref_kvcache(q, kc, vc, lens, scale, k=kn, v=vn, block_table=table, compute_dtype=dtype, **kw)
    out, lse = llmkern.flash_attn_with_kvcache(
        q, kc, vc, k=kn, v=vn, cache_seqlens=lens, block_table=table, causal=causal,
        window_size=window, softcap=softcap, alibi_slopes=alibi, num_splits=splits,
        return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, hq, s)
    assert torch.equal(kc, ref_kc) and torch.equal(vc, ref_vc), "k/v must be appended in place"
    _assert_close(out, ref, same, dtype)
    _assert_lse(lse, ref_lse)
    assert torch.equal(lens, torch.tensor(cache_lens, dtype=torch.int32, device=dev))


# Shapes of the CPU bf16 decode kernel (AVX512_BF16, head_dim multiples of 32 up to 256): more rows per kv head
# than one chunk of 4, short appends, block size 1, a dense cache, and the score transforms.
# (batch, s, hq, hkv, d, block_size, causal, window, softcap, alibi)
BF16_DECODE_CASES = [
    (3, 1, 9, 3, 64, 16, False, (-1, -1), 0.0, None),
    (2, 1, 16, 2, 32, 5, False, (-1, -1), 0.0, None),
    (2, 3, 6, 2, 128, 16, True, (-1, -1), 0.0, None),
    (2, 1, 6, 3, 64, 0, False, (40, 0), 30.0, "heads"),
    (1, 2, 5, 1, 64, 1, True, (-1, -1), 0.0, "batch"),
    (2, 1, 8, 2, 96, 16, False, (-1, -1), 0.0, None),
    (2, 2, 8, 1, 256, 16, True, (-1, -1), 0.0, None),
    (1, 1, 4, 2, 80, 16, False, (-1, -1), 0.0, None),  # not a multiple of 32: the generic kernel
]


@pytest.mark.parametrize("case", BF16_DECODE_CASES)
def test_kvcache_bf16_decode_shapes(case):
    batch, s, hq, hkv, d, bs, causal, window, softcap, alibi_kind = case
    cache_lens = [1000, 77, 130][:batch]
    q, kc, vc, _, _, lens, table = _kvcache_case("cpu", torch.bfloat16, batch, s, hq, hkv, d, bs, cache_lens, False,
                                                 garbage=bs in (1, 5))
    kw = _kw(causal, window, softcap, _alibi(alibi_kind, batch, hq, "cpu"))
    ref, ref_lse, _, _ = ref_kvcache(q, kc, vc, lens, d ** -0.5, block_table=table, **kw)
    same, _, _, _ = ref_kvcache(q, kc, vc, lens, d ** -0.5, block_table=table, compute_dtype=torch.bfloat16, **kw)
    out, lse = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, causal=causal,
                                               window_size=window, softcap=softcap, alibi_slopes=kw["alibi"],
                                               return_softmax_lse=True)
    _assert_close(out, ref, same, torch.bfloat16)
    _assert_lse(lse, ref_lse)


def test_kvcache_splits_agree(be):
    """Every num_splits gives the same result (up to fp32 rounding) as no split."""
    dev = be.device
    q, kc, vc, _, _, lens, table = _kvcache_case(dev, torch.float32, 2, 1, 8, 2, 64, 16, [700, 33], False)
    base = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=1)
    for n in (0, 2, 5, 64):
        out = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table, num_splits=n)
        assert (out - base).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_decode_rows_do_not_depend_on_the_batch(dtype):
    """The automatic split-KV count of a sequence depends on that sequence alone (its keys, its own
    tasks), so a sequence decoded alone or in any sub-batch gets the bits it gets in the full batch,
    short ones beside long ones included."""
    torch.manual_seed(0)
    hq, hkv, d, nb, bs = 8, 2, 64, 600, 16
    kc, vc = torch.randn(nb, bs, hkv, d).to(dtype), torch.randn(nb, bs, hkv, d).to(dtype)
    lens = torch.tensor([37, 700, 5, 300, 1200, 64, 16, 999], dtype=torch.int32)
    table = torch.randperm(nb)[:8 * 75].view(8, 75).int()
    q = torch.randn(8, 1, hq, d).to(dtype)

    def dec(idx):
        return llmkern.flash_attn_with_kvcache(q[idx], kc, vc, cache_seqlens=lens[idx], block_table=table[idx])

    full = dec(slice(None))
    ref, _, _, _ = ref_kvcache(q, kc, vc, lens, d ** -0.5, block_table=table)
    assert (full.double() - ref).abs().max() < (1e-4 if dtype == torch.float32 else 3e-2)
    for i in range(8):
        assert torch.equal(dec(slice(i, i + 1)), full[i:i + 1]), i
    assert torch.equal(dec(slice(0, 3)), full[:3]) and torch.equal(dec(slice(4, 8)), full[4:])


def test_kvcache_defaults_and_out(be):
    dev = be.device
    kc = torch.randn(2, 40, 2, 64, device=dev)
    vc = torch.randn(2, 40, 2, 64, device=dev)
    q = torch.randn(2, 1, 4, 64, device=dev)
    out = torch.empty_like(q)
    res = llmkern.flash_attn_with_kvcache(q, kc, vc, out=out)  # cache_seqlens None: whole cache
    assert res is out
    ref, _, _, _ = ref_kvcache(q, kc, vc, torch.tensor([40, 40]), 64 ** -0.5)
    assert (out - ref).abs().max() < 3e-5
    res2 = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=25)  # int cache_seqlens
    ref2, _, _, _ = ref_kvcache(q, kc, vc, torch.tensor([25, 25]), 64 ** -0.5)
    assert (res2 - ref2).abs().max() < 3e-5
    # zero-length caches give zeros and lse = +inf
    o, lse = llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=0, return_softmax_lse=True)
    assert not o.any() and torch.isinf(lse).all()


def test_opcheck_attention():
    lens = [5, 0, 9]
    q = torch.randn(14, 4, 64)
    k, v = torch.randn(14, 2, 64), torch.randn(14, 2, 64)
    cu = _cu(lens, "cpu")
    torch.library.opcheck(attn_ops._varlen.op, (q, k, v, cu, cu, 9, 9, 0.125, True, -1, -1, 0.0, None, None, None, True))
    table, nblk = _paged([9, 4], 4, "cpu")
    kc, vc = torch.randn(nblk, 4, 2, 64), torch.randn(nblk, 4, 2, 64)
    cuk = _cu([9, 4], "cpu")
    cuq = _cu([3, 4], "cpu")
    torch.library.opcheck(attn_ops._varlen.op, (torch.randn(7, 4, 64), kc, vc, cuq, cuk, 4, 9, 0.125, True, -1, -1, 0.0, None, table, None, False))
    qd = torch.randn(2, 2, 4, 64)
    kn, vn = torch.randn(2, 2, 2, 64), torch.randn(2, 2, 2, 64)
    lens_c = torch.tensor([3, 1], dtype=torch.int32)
    torch.library.opcheck(attn_ops._kvcache.op, (qd, kc, vc, kn, vn, None, None, lens_c, None, None, table, 0.125,
                                                 True, -1, -1, 0.0, True, None, 0, None, True))
    # dense cache with rotary, cache_leftpad and cache_batch_idx (flash-attn's kvcache extras)
    kd, vd = torch.randn(3, 16, 2, 64), torch.randn(3, 16, 2, 64)
    cos, sin = torch.randn(16, 16), torch.randn(16, 16)
    idx, pad = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32)
    torch.library.opcheck(attn_ops._kvcache.op, (qd, kd, vd, kn, vn, cos, sin, lens_c, idx, pad, None, 0.125,
                                                 True, -1, -1, 0.0, False, None, 0, None, True))


def test_torch_compile_fullgraph_attention():
    lens = [6, 3]
    cu = _cu(lens, "cpu")
    q = torch.randn(9, 4, 64)
    k, v = torch.randn(9, 2, 64), torch.randn(9, 2, 64)
    kc, vc = torch.zeros(2, 16, 2, 64), torch.zeros(2, 16, 2, 64)
    qd = torch.randn(2, 1, 4, 64)

    def f(q, k, v, cu, qd, kc, vc, lens):
        o = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True)
        od = llmkern.flash_attn_with_kvcache(qd, kc, vc, k=k[:2].unsqueeze(1), v=v[:2].unsqueeze(1), cache_seqlens=lens)
        return o * 2, od + 1

    lens = torch.tensor([4, 0], dtype=torch.int32)
    kc_e, vc_e = kc.clone(), vc.clone()
    want = f(q, k, v, cu, qd, kc_e, vc_e, lens)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, cu, qd, kc, vc, lens)
    assert torch.allclose(got[0], want[0]) and torch.allclose(got[1], want[1])
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)


@pytest.mark.parametrize("env", [{"LLMKERN_ATTN_BF16_DOT": "0"}, {"LLMKERN_CPU_ISA": "avx2"}, {"LLMKERN_CPU_ISA": "scalar"}],
                         ids=["avx512-no-bf16-dot", "avx2", "scalar"])
def test_other_cpu_paths(env):
    """The SIMD level (and the AVX512_BF16 choice) is read once per process: run a bf16/fp16
    prefill + paged decode check in a subprocess for the paths this CPU would not pick."""
    import os
    import subprocess
    import sys

    code = r'''
import torch, llmkern
from reference import ref_varlen, ref_kvcache
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16):
    lens = [70, 3]
    cu = torch.tensor([0, 70, 73], dtype=torch.int32)
    q = torch.randn(73, 8, 72).to(dtype); k = torch.randn(73, 2, 72).to(dtype); v = torch.randn(73, 2, 72).to(dtype)
    out = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True)
    ref, _ = ref_varlen(q, k, v, cu, cu, 72 ** -0.5, causal=True)
    same, _ = ref_varlen(q, k, v, cu, cu, 72 ** -0.5, causal=True, compute_dtype=dtype)
    assert (out.float() - ref).abs().max() <= 2 * (same.float() - ref).abs().max() + 1e-2
    kc = torch.randn(9, 16, 2, 72).to(dtype); vc = torch.randn(9, 16, 2, 72).to(dtype)
    table = torch.randperm(9)[:8].view(2, 4).to(torch.int32)
    lens = torch.tensor([50, 17], dtype=torch.int32)
    qd = torch.randn(2, 1, 8, 72).to(dtype)
    o = llmkern.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=lens, block_table=table)
    r, _, _, _ = ref_kvcache(qd, kc, vc, lens, 72 ** -0.5, block_table=table)
    s, _, _, _ = ref_kvcache(qd, kc, vc, lens, 72 ** -0.5, block_table=table, compute_dtype=dtype)
    assert (o.float() - r).abs().max() <= 2 * (s.float() - r).abs().max() + 1e-2
print("ok")
'''
    here = os.path.dirname(os.path.abspath(__file__))
    envs = dict(os.environ, **env)
    envs["PYTHONPATH"] = os.pathsep.join([here] + sys.path)
    res = subprocess.run([sys.executable, "-c", code], env=envs, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_keys_outside_a_sequence_never_reach_it(be):
    """Keys a sequence does not own (other sequences' rows, the unused tail of its last block,
    blocks outside its table) never affect its output, even when they hold NaN / inf."""
    dev, nan = be.device, float("nan")
    d = 64
    # dense varlen: sequence 1's keys and values are NaN and +inf
    lens = [37, 20, 45]
    cu = _cu(lens, dev)
    q = torch.randn(sum(lens), 4, d, device=dev)
    k, v = torch.randn(sum(lens), 2, d, device=dev), torch.randn(sum(lens), 2, d, device=dev)
    k[37:57], v[37:57] = nan, float("inf")
    out = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, 45, 45, causal=True)
    ref, _ = ref_varlen(q, k, v, cu, cu, d ** -0.5, causal=True)
    keep = torch.ones(sum(lens), dtype=torch.bool, device=dev)
    keep[37:57] = False
    assert (out[keep] - ref[keep]).abs().max() < 3e-5
    # paged: every cache row a sequence does not own is NaN (block tails, unowned blocks)
    bs, lens_k = 16, [17, 31, 5]
    table, nblk = _paged(lens_k, bs, dev, garbage=True)
    kc = torch.full((nblk, bs, 2, d), nan, device=dev)
    vc = torch.full((nblk, bs, 2, d), nan, device=dev)
    for b, n in enumerate(lens_k):
        for pos in range(n):
            blk = int(table[b, pos // bs])
            kc[blk, pos % bs], vc[blk, pos % bs] = torch.randn(2, d), torch.randn(2, d)
    cuk, cuq = _cu(lens_k, dev), _cu([4, 31, 1], dev)
    qp = torch.randn(36, 4, d, device=dev)
    out = llmkern.flash_attn_varlen_func(qp, kc, vc, cuq, cuk, 31, 31, causal=True, block_table=table)
    ref, _ = ref_varlen(qp, kc, vc, cuq, cuk, d ** -0.5, causal=True, block_table=table)
    assert torch.isfinite(out).all() and (out - ref).abs().max() < 3e-5
    # decode, appending one new row per sequence into the first free slot (NaN before)
    qd = torch.randn(3, 1, 4, d, device=dev)
    kn, vn = torch.randn(3, 1, 2, d, device=dev), torch.randn(3, 1, 2, d, device=dev)
    seqlens = torch.tensor([16, 30, 4], dtype=torch.int32, device=dev)
    ref, _, _, _ = ref_kvcache(qd, kc, vc, seqlens, d ** -0.5, k=kn, v=vn, block_table=table)
    for splits in (1, 3):
        out = llmkern.flash_attn_with_kvcache(qd, kc.clone(), vc.clone(), k=kn, v=vn, cache_seqlens=seqlens,
                                              block_table=table, num_splits=splits)
        assert torch.isfinite(out).all() and (out - ref).abs().max() < 3e-5


def test_nan_in_a_causally_hidden_key(be):
    """Documented behaviour (flash-attn's, and torch SDPA's): keys inside a sequence that a query
    does not attend to (causal mask, window) are weighted by zero, so a NaN there may reach that
    query too (0 * NaN). Every query that attends to the NaN key is NaN; every other row is either
    NaN or exactly what it would be without the NaN."""
    dev = be.device
    T, d = 100, 64
    q = torch.randn(T, 2, d, device=dev)
    k, v = torch.randn(T, 2, d, device=dev), torch.randn(T, 2, d, device=dev)
    cu = _cu([T], dev)
    clean = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True)
    v[50] = float("nan")
    out = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, T, T, causal=True)
    nan_rows = torch.isnan(out).flatten(1).any(1)
    assert nan_rows[50:].all(), "rows that attend to the NaN value must be NaN"
    fin = ~nan_rows
    assert torch.isfinite(out[fin]).all() and torch.equal(out[fin], clean[fin])


def test_prefill_on_amx_tiles_emulated():
    """The AMX tile kernel of bf16 prefill (attend_gemm on tdpbf16ps), run on the tiles' software model
    so that every AVX-512 CPU tests its packing and padding: head_dim 64 / 128, GQA 4:1, rows not a
    multiple of 32, keys past one 64-key tile and a last tile of fewer than 32, causal, sliding window
    with softcap and ALiBi, a paged prefill over a cached prefix, split-KV over keys packed once for
    all tasks, and a NaN value past the rows' keys. head_dim 72 (not a multiple of 32) falls back to
    the vdpbf16ps kernel."""
    import os
    import subprocess
    import sys

    from runtime_helpers import amx_model_or_skip

    amx_model_or_skip()
    code = r'''
import torch, llmkern
from reference import ref_varlen
info = llmkern.build_info()
assert info["cpu_amx"] == "emulated" and info["cpu_kernels"]["attention bf16"].startswith("amx-bf16"), info
torch.manual_seed(0)
dt = torch.bfloat16
def check(out, q, k, v, cu_q, cu_k, scale, **kw):
    ref, _ = ref_varlen(q, k, v, cu_q, cu_k, scale, **kw)
    same, _ = ref_varlen(q, k, v, cu_q, cu_k, scale, compute_dtype=dt, **kw)
    err, tol = (out.float() - ref).abs().max(), 2 * (same.float() - ref).abs().max() + 1e-2
    assert err <= tol, (err, tol, kw)
for d in (64, 128, 72):
    lens = [70, 130, 17]
    cu = torch.tensor([0, 70, 200, 217], dtype=torch.int32)
    q = torch.randn(217, 8, d).to(dt); k = torch.randn(217, 2, d).to(dt); v = torch.randn(217, 2, d).to(dt)
    for kw in ({"causal": True}, {"causal": False}, {"causal": True, "window": (40, 0), "softcap": 5.0}):
        extra = dict(window_size=kw["window"], softcap=kw["softcap"]) if "window" in kw else {}
        out = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=kw["causal"], **extra)
        check(out, q, k, v, cu, cu, d ** -0.5, **kw)
    slopes = torch.rand(8) * 0.2
    out = llmkern.flash_attn_varlen_func(q, k, v, cu, cu, 130, 130, causal=True, alibi_slopes=slopes)
    check(out, q, k, v, cu, cu, d ** -0.5, causal=True, alibi=slopes)
# paged prefill: 40 new rows over 100 cached keys in 16-key blocks
kc = torch.randn(12, 16, 2, 64).to(dt); vc = torch.randn(12, 16, 2, 64).to(dt)
table = torch.randperm(12)[:9].view(1, 9).to(torch.int32)
q = torch.randn(40, 8, 64).to(dt)
cu_q = torch.tensor([0, 40], dtype=torch.int32); cu_k = torch.tensor([0, 140], dtype=torch.int32)
out = llmkern.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 40, 140, causal=True, block_table=table)
check(out, q, kc, vc, cu_q, cu_k, 64 ** -0.5, block_table=table, causal=True)
# split-KV: 4 rows x 4 heads per kv head over 600 cached keys, cut into splits whose key ranges do
# not start on a 32-key block (the packed K / V^T tiles start on one; the keys before the split
# are masked)
kc = torch.randn(40, 16, 2, 64).to(dt); vc = torch.randn(40, 16, 2, 64).to(dt)
table = torch.randperm(40)[:38].view(1, 38).to(torch.int32)
q = torch.randn(4, 8, 64).to(dt)
cu_q = torch.tensor([0, 4], dtype=torch.int32); cu_k = torch.tensor([0, 600], dtype=torch.int32)
for kw in ({"causal": True}, {"causal": True, "window": (150, 0)}):
    extra = dict(window_size=kw["window"]) if "window" in kw else {}
    out = llmkern.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 4, 600, causal=True, block_table=table, **extra)
    check(out, q, kc, vc, cu_q, cu_k, 64 ** -0.5, block_table=table, **kw)
# keys past a task's last visible key but inside its last 32-key block are weighted by an exact zero:
# a NaN value there stays out of the rows before it (3 query heads per kv head: the first task's
# 85 rows end inside the block of keys 64-95)
q, k, v = torch.randn(120, 6, 64).to(dt), torch.randn(120, 2, 64).to(dt), torch.randn(120, 2, 64).to(dt)
cu1 = torch.tensor([0, 120], dtype=torch.int32)
clean = llmkern.flash_attn_varlen_func(q, k, v, cu1, cu1, 120, 120, causal=True)
v[90] = float("nan")
out = llmkern.flash_attn_varlen_func(q, k, v, cu1, cu1, 120, 120, causal=True)
assert torch.equal(out[:85], clean[:85]) and out[90:].isnan().all()
# a task's scratch keeps what the last one left (here NaN values on every thread): keys past a short
# tile must not carry it into the next sequence
cu8 = torch.arange(9, dtype=torch.int32) * 64
nan_v = torch.full((512, 2, 64), float("nan")).to(dt)
llmkern.flash_attn_varlen_func(torch.randn(512, 8, 64).to(dt), torch.randn(512, 2, 64).to(dt), nan_v, cu8, cu8, 64, 64)
cu1 = torch.tensor([0, 40], dtype=torch.int32)
q, k, v = torch.randn(40, 8, 64).to(dt), torch.randn(40, 2, 64).to(dt), torch.randn(40, 2, 64).to(dt)
out = llmkern.flash_attn_varlen_func(q, k, v, cu1, cu1, 40, 40, causal=True)
assert not out.isnan().any()
check(out, q, k, v, cu1, cu1, 64 ** -0.5, causal=True)
print("ok")
'''
    here = os.path.dirname(os.path.abspath(__file__))
    envs = dict(os.environ, LLMKERN_CPU_ISA="amx-emulated")
    envs["PYTHONPATH"] = os.pathsep.join([here] + sys.path)
    res = subprocess.run([sys.executable, "-c", code], env=envs, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]

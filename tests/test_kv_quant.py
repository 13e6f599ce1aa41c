"""Quantised KV caches (kv_cache_dtype fp8 / fp8_e4m3 / fp8_e5m2 / int8), kernels on every backend:
cache writes bit-exact against torch's float8 casts (int8: torch.round) of x / scale, and the
attention ops that read the paged cache against an fp64 reference on the dequantised cache."""
import pytest
import torch

import llmkern
from llmkern.ops.attention import decode_append_paged
from reference import ref_kvcache, ref_rotary_rows, ref_varlen

KINDS = ["fp8", "fp8_e5m2", "int8"]
_FP8 = {"fp8": (torch.float8_e4m3fn, 448.0), "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
        "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def cache_dtype(kind):
    return torch.int8 if kind == "int8" else torch.uint8


def ref_codes(x, scale, kind):
    """torch's codes of x [n, H, D] with scale [H] (or one): the cast of the clamped fp32 x / scale."""
    y = x.float() / scale.float().reshape(-1, 1)
    if kind == "int8":
        return y.round().clamp(-127, 127).to(torch.int8)
    dt, top = _FP8[kind]
    return y.clamp(-top, top).to(dt).view(torch.uint8)


def dequant(codes, scale, kind):
    """fp64 values of a cache [..., H, D] of codes, scale [H] (or one)."""
    vals = codes if kind == "int8" else codes.view(_FP8[kind][0])
    return vals.double() * scale.double().reshape(-1, 1)


def random_cache(shape, kind, scale, dev):
    """A cache of codes of N(0, 1) values (every code region used: scale ~ amax / range)."""
    x = torch.randn(shape[0] * shape[1], shape[2], shape[3], device=dev)
    return ref_codes(x, scale, kind).view(shape)


def put_every_code(cache, block, kind):
    """Every finite code once (subnormals, zeros of both signs, the largest) into the first rows
    of `block`, so that the readers' decoding of each is checked."""
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    if kind != "int8":
        every[~torch.isfinite(every.view(_FP8[kind][0]).float())] = 0
    flat = cache[block].view(-1)
    flat[:256] = every.view(cache.dtype).to(cache.device)


def scales(kind, heads, per_head, dev):
    top = 127.0 if kind == "int8" else _FP8[kind][1]
    s = torch.full((heads,), 4.0 / top, device=dev) * torch.linspace(0.8, 1.3, heads, device=dev)
    return s if per_head else s[:1].reshape(())


def special_values(kind):
    """Values that probe the rounding: midpoints between neighbouring codes (ties go to even),
    just above / below them, subnormals, zeros, and magnitudes past the largest code."""
    if kind == "int8":
        base = torch.arange(-130, 131, dtype=torch.float32)
        return torch.cat([base, base + 0.5, base + 0.49, base + 0.51])
    dt, top = _FP8[kind]
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt).float()
    vals = vals[torch.isfinite(vals)].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    return torch.cat([vals, mids, mids * (1 + 2 ** -12), mids * (1 - 2 ** -12),
                      torch.tensor([0.0, -0.0, top * 1.01, -top * 1.5, top * 100, 1e-30])])


@pytest.mark.parametrize("kind", ["fp8", "fp8_e4m3", "fp8_e5m2", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_head", [False, True])
def test_quantised_write_bit_exact(backend, kind, dtype, per_head):
    dev = backend.device
    heads, d, bs = 2, 64, 5
    special = special_values(kind)
    n = (special.numel() + heads * d - 1) // (heads * d) + 6
    x = torch.randn(n, heads, d) * torch.logspace(-3, 2, n)[:, None, None]
    x.view(-1)[: special.numel()] = special
    x = x.to(dtype).to(dev)
    s = scales(kind, heads, per_head, dev) if kind != "int8" else torch.ones(heads if per_head else 1, device=dev) * 0.5
    slots = torch.randperm(n + 7, device=dev)[:n]
    slots[3] = -1  # padding: skipped
    kc = torch.zeros(-(-(n + 7) // bs), bs, heads, d, dtype=cache_dtype(kind), device=dev)
    vc = torch.zeros_like(kc)
    llmkern.reshape_and_cache_flash(x, -x, kc, vc, slots, kv_cache_dtype=kind, k_scale=s, v_scale=s * 2)
    keep = slots >= 0
    got_k = kc.view(-1, heads, d)[slots[keep]]
    got_v = vc.view(-1, heads, d)[slots[keep]]
    assert torch.equal(got_k.cpu(), ref_codes(x[keep].cpu(), s.cpu(), kind))
    assert torch.equal(got_v.cpu(), ref_codes(-x[keep].cpu(), (s * 2).cpu(), kind))


def _paged_setup(dev, kind, per_head, lens, bs=5, hkv=2, d=64):
    max_blocks = max(-(-n // bs) for n in lens) + 1
    nb = len(lens) * max_blocks + 3
    ks, vs = scales(kind, hkv, per_head, dev), scales(kind, hkv, per_head, dev) * 1.5
    kc = random_cache((nb, bs, hkv, d), kind, ks, dev)
    vc = random_cache((nb, bs, hkv, d), kind, vs, dev)
    table = torch.randperm(nb, device=dev)[: len(lens) * max_blocks].view(len(lens), max_blocks).to(torch.int32)
    longest = max(range(len(lens)), key=lambda i: lens[i])  # its first block is read in full
    for c in (kc, vc):
        put_every_code(c, int(table[longest, 0]), kind)
    return kc, vc, ks, vs, table


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [0, 3])
def test_paged_decode_reads_codes(backend, kind, dtype, num_splits):
    dev = backend.device
    lens = [1, 17, 40]
    hq, hkv, d = 6, 2, 64
    kc, vc, ks, vs, table = _paged_setup(dev, kind, num_splits == 3, lens)
    q = torch.randn(len(lens), 1, hq, d, device=dev).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    out, lse = flash_attn_kv(q, kc, vc, seqlens, table, kind, ks, vs, num_splits=num_splits)
    ref, ref_lse, _, _ = ref_kvcache(q.double(), dequant(kc, ks, kind), dequant(vc, vs, kind), seqlens,
                                     d ** -0.5, block_table=table, compute_dtype=torch.float64, causal=True)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert (out.double() - ref.double()).abs().max().item() < tol
    assert (lse.double() - ref_lse.double()).abs().max().item() < 1e-4


def flash_attn_kv(q, kc, vc, seqlens, table, kind, ks, vs, **kw):
    return llmkern.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table, causal=True,
                                           return_softmax_lse=True, kv_cache_dtype=kind, k_scale=ks,
                                           v_scale=vs, **kw)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_prefill_reads_codes(backend, kind, dtype):
    dev = backend.device
    k_lens, q_lens = [10, 33, 20], [3, 20, 1]  # queries are each sequence's last rows
    hq, hkv, d = 6, 2, 64
    kc, vc, ks, vs, table = _paged_setup(dev, kind, True, k_lens)
    q = torch.randn(sum(q_lens), hq, d, device=dev).to(dtype)
    cu_q = torch.tensor([0, 3, 23, 24], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 10, 43, 63], dtype=torch.int32, device=dev)
    out, lse = llmkern.flash_attn_varlen_func(
        q, kc, vc, cu_q, cu_k, max(q_lens), max(k_lens), causal=True, block_table=table,
        return_softmax_lse=True, kv_cache_dtype=kind, k_scale=ks, v_scale=vs)
    ref, ref_lse = ref_varlen(q.double(), dequant(kc, ks, kind), dequant(vc, vs, kind), cu_q, cu_k, d ** -0.5,
                              block_table=table, compute_dtype=torch.float64, causal=True)
    tol = 2e-5 if dtype == torch.float32 else 5e-3
    assert (out.double() - ref.double()).abs().max().item() < tol
    assert (lse.double() - ref_lse.double()).abs().max().item() < 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_decode_append_paged_quantises_rotated_key(backend, kind):
    """The fused decode step (rotate the new key, write it, attend): the written codes are those of
    the key the unquantised call writes, and the output matches the reference on the codes."""
    dev = backend.device
    lens = [4, 12]
    hq, hkv, d = 4, 2, 64
    kc, vc, ks, vs, table = _paged_setup(dev, kind, True, [n + 1 for n in lens])
    b = len(lens)
    q = torch.randn(b, 1, hq, d, device=dev)
    k, v = torch.randn(b, 1, hkv, d, device=dev), torch.randn(b, 1, hkv, d, device=dev)
    ang = torch.arange(64, device=dev)[:, None] * 0.1 / (1 + torch.arange(d // 2, device=dev))[None]
    cos, sin = ang.cos(), ang.sin()
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    decode_append_paged(q, kc, vc, k, v, cos, sin, seqlens, table, d ** -0.5, (-1, -1), out,
                        kv_cache_dtype=kind, k_scale=ks, v_scale=vs)
    plain_k, plain_v = dequant(kc, ks, kind).float(), dequant(vc, vs, kind).float()
    decode_append_paged(q, plain_k, plain_v, k, v, cos, sin, seqlens, table, d ** -0.5, (-1, -1),
                        torch.empty_like(q))
    bs = kc.shape[1]
    for i, n in enumerate(lens):
        blk, off = int(table[i, n // bs]), n % bs
        assert torch.equal(kc[blk, off].cpu(), ref_codes(plain_k[blk, off][None].cpu(), ks.cpu(), kind)[0])
        assert torch.equal(vc[blk, off].cpu(), ref_codes(v[i, 0][None].cpu(), vs.cpu(), kind)[0])
    q_rot = ref_rotary_rows(q[:, 0], cos, sin, seqlens, interleaved=False)[:, None]
    ref, _, _, _ = ref_kvcache(q_rot.double(), dequant(kc, ks, kind), dequant(vc, vs, kind), seqlens + 1,
                               d ** -0.5, block_table=table, compute_dtype=torch.float64, causal=True)
    assert (out.double() - ref).abs().max().item() < 2e-5


def test_copy_and_swap_blocks_move_codes(backend):
    dev = backend.device
    kc = torch.randint(0, 256, (6, 3, 2, 8), dtype=torch.uint8, device=dev)
    vc = torch.randint(-128, 128, (6, 3, 2, 8), dtype=torch.int8, device=dev)
    k0, v0 = kc.clone(), vc.clone()
    llmkern.copy_blocks([kc], [kc.clone()], torch.tensor([[0, 5]], device=dev))
    assert torch.equal(kc[5], k0[0])
    host = torch.zeros(4, 3, 2, 8, dtype=torch.int8)
    llmkern.swap_blocks(vc, host, torch.tensor([[1, 2]]))
    assert torch.equal(host[2], v0[1].cpu())


def test_bad_arguments_name_the_field():
    kc = torch.zeros(2, 4, 1, 8, dtype=torch.uint8)
    x = torch.randn(3, 1, 8)
    slots = torch.arange(3)
    s = torch.tensor([0.1])
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        llmkern.reshape_and_cache_flash(x, x, kc, kc.clone(), slots, kv_cache_dtype="fp4", k_scale=s, v_scale=s)
    with pytest.raises(ValueError, match="k_scale"):
        llmkern.reshape_and_cache_flash(x, x, kc, kc.clone(), slots, kv_cache_dtype="fp8", v_scale=s)
    with pytest.raises(ValueError, match="v_scale"):
        llmkern.reshape_and_cache_flash(x, x, kc, kc.clone(), slots, kv_cache_dtype="fp8", k_scale=s,
                                        v_scale=torch.ones(3))
    with pytest.raises(TypeError, match="key_cache"):
        llmkern.reshape_and_cache_flash(x, x, kc.to(torch.int8), kc.to(torch.int8), slots, kv_cache_dtype="fp8",
                                        k_scale=s, v_scale=s)
    with pytest.raises(ValueError, match="k_scale"):
        llmkern.reshape_and_cache_flash(x, x, kc, kc.clone(), slots, kv_cache_dtype="fp8",
                                        k_scale=torch.tensor([-1.0]), v_scale=s)
    q = torch.randn(1, 1, 1, 8)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        llmkern.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=1, block_table=torch.zeros(1, 2, dtype=torch.int32),
                                        kv_cache_dtype="e4m3", k_scale=s, v_scale=s)
    with pytest.raises(TypeError, match="k_cache"):  # a float cache is not a quantised one
        llmkern.flash_attn_with_kvcache(q, kc.float(), kc.float(), cache_seqlens=1,
                                        block_table=torch.zeros(1, 2, dtype=torch.int32),
                                        kv_cache_dtype="fp8", k_scale=s, v_scale=s)


@pytest.mark.parametrize("kind", KINDS)
def test_dense_cache_append_and_padded_head_dim(backend, kind):
    """A dense cache [b, seqlen, Hkv, D] with head_dim 36 (zero-padded around the kernels): the
    appended rows are stored as codes and attended to with the rest."""
    dev = backend.device
    b, cap, hq, hkv, d, s_new = 2, 24, 4, 2, 36, 2
    ks, vs = scales(kind, hkv, True, dev), scales(kind, hkv, False, dev)
    kc = random_cache((b, cap, hkv, d), kind, ks, dev)
    vc = random_cache((b, cap, hkv, d), kind, vs, dev)
    q = torch.randn(b, s_new, hq, d, device=dev)
    k, v = torch.randn(b, s_new, hkv, d, device=dev), torch.randn(b, s_new, hkv, d, device=dev)
    seqlens = torch.tensor([5, 19], dtype=torch.int32, device=dev)
    out = llmkern.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                          kv_cache_dtype=kind, k_scale=ks, v_scale=vs)
    for i, n in enumerate(seqlens.tolist()):
        assert torch.equal(kc[i, n:n + s_new].cpu(), ref_codes(k[i].cpu(), ks.cpu(), kind))
        assert torch.equal(vc[i, n:n + s_new].cpu(), ref_codes(v[i].cpu(), vs.cpu(), kind))
    ref, _, _, _ = ref_kvcache(q.double(), dequant(kc, ks, kind), dequant(vc, vs, kind), seqlens + s_new,
                               d ** -0.5, compute_dtype=torch.float64, causal=True)
    assert (out.double() - ref).abs().max().item() < 2e-5


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_long_decode_split_automatically(backend, kind):
    """One long sequence: the CPU kernel splits its keys on its own (split-KV), the partial
    results merged by the log-sum-exp combine."""
    dev = backend.device
    lens = [700]
    kc, vc, ks, vs, table = _paged_setup(dev, kind, True, lens, bs=16)
    q = torch.randn(1, 1, 6, 64, device=dev)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    out, lse = flash_attn_kv(q, kc, vc, seqlens, table, kind, ks, vs)
    ref, ref_lse, _, _ = ref_kvcache(q.double(), dequant(kc, ks, kind), dequant(vc, vs, kind), seqlens, 64 ** -0.5,
                                     block_table=table, compute_dtype=torch.float64, causal=True)
    assert (out.double() - ref).abs().max().item() < 2e-5
    assert (lse.double() - ref_lse.double()).abs().max().item() < 1e-4
